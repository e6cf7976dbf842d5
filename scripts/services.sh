#!/usr/bin/env bash
# Real services for the streaming worker and its tests, on loopback:
#   Apache Kafka 3.9.1, KRaft, one combined broker+controller on 127.0.0.1:9092
#   plus, for the security tests: SASL_PLAINTEXT on 127.0.0.1:9094 (SASL/PLAIN, user "fairstream"),
#   SSL on 127.0.0.1:9095 (mutual TLS: clients present a certificate) and SASL_SSL on 127.0.0.1:9096,
#   with a throw-away certificate authority made here (.services/kafka/tls/ca.pem, client.pem, client.key)
#   Redis on 127.0.0.1:6379
# Usage: scripts/services.sh start|stop|status
# `start` is idempotent: it installs what is missing (Kafka's jars from Maven Central with mvn,
# redis-server, kcat, chromium and chromium-driver from Debian's packages), then starts whatever
# this checkout has not started yet. A port that answers but that this checkout did not start
# (another checkout's broker, another program) is refused in one line, and so is restarting it:
# pick other ports (FAIRSTREAM_KAFKA_PORT, FAIRSTREAM_KAFKA_CONTROLLER_PORT,
# FAIRSTREAM_KAFKA_SASL_PORT, FAIRSTREAM_KAFKA_SSL_PORT, FAIRSTREAM_KAFKA_SASL_SSL_PORT,
# FAIRSTREAM_REDIS_PORT), stop it where it runs, or set FAIRSTREAM_SERVICES_REUSE=1 to use it.
# State, logs and pids live in .services/ (git-ignored). Where Docker is available,
# docker-compose.yml is the documented alternative.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/.services"
kafka_dir="$dir/kafka"
redis_dir="$dir/redis"
KAFKA_PORT="${FAIRSTREAM_KAFKA_PORT:-9092}"
CONTROLLER_PORT="${FAIRSTREAM_KAFKA_CONTROLLER_PORT:-9093}"
REDIS_PORT="${FAIRSTREAM_REDIS_PORT:-6379}"
SASL_PORT="${FAIRSTREAM_KAFKA_SASL_PORT:-9094}"   # SASL/PLAIN listener, for the security tests
SSL_PORT="${FAIRSTREAM_KAFKA_SSL_PORT:-9095}"     # mutual-TLS listener, for the security tests
SASL_SSL_PORT="${FAIRSTREAM_KAFKA_SASL_SSL_PORT:-9096}"  # SASL/PLAIN over TLS, for the security tests
tls_dir="$kafka_dir/tls"
TLS_PASS="fairstream-test-keystore"  # protects a throw-away test keystore, nothing else

log() { echo "services: $*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Whether the service whose pid file is $1 (in this checkout's .services/) was started here on
# port $2 and is alive: the pid is alive and the port it was started on (in $1.port) is $2.
started_here() {
  local pid; pid="$(cat "$1" 2>/dev/null || true)"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ "$(cat "$1.port" 2>/dev/null || true)" = "$2" ]
}

# $1 answers on port $2 but was not started here: use it only if told to.
not_ours() {
  if [ "${FAIRSTREAM_SERVICES_REUSE:-0}" = 1 ]; then
    log "$1 on 127.0.0.1:$2 was not started by this checkout; using it (FAIRSTREAM_SERVICES_REUSE=1)"; return 0
  fi
  log "$1: 127.0.0.1:$2 answers but this checkout did not start it (another checkout's or program's): stop it there, pick other ports (FAIRSTREAM_KAFKA_PORT, FAIRSTREAM_REDIS_PORT, ...: README, \"Services\") or set FAIRSTREAM_SERVICES_REUSE=1 to use it"
  exit 1
}

apt_install() {
  if [ "$(id -u)" != 0 ]; then
    log "need $* (Debian packages); run as root or install them: apt-get install -y $*"
    exit 1
  fi
  if [ ! -f "$dir/.apt-updated" ]; then
    apt-get update -qq >/dev/null 2>&1 || true
    mkdir -p "$dir" && touch "$dir/.apt-updated"
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_tools() {
  command -v redis-server >/dev/null || { log "installing redis-server"; apt_install redis-server; }
  command -v kcat >/dev/null || { log "installing kcat"; apt_install kcat; }
  command -v openssl >/dev/null || { log "installing openssl"; apt_install openssl; }
  command -v java >/dev/null || { log "installing a Java runtime"; apt_install openjdk-17-jre-headless; }
  # A real headless browser for the web page's test (tests/live/test_visibility_live.py).
  { command -v chromium >/dev/null && command -v chromedriver >/dev/null; } \
    || { log "installing chromium and chromium-driver"; apt_install chromium chromium-driver; }
  if [ ! -f "$kafka_dir/libs/.complete" ]; then
    command -v mvn >/dev/null || { log "installing maven"; apt_install maven; }
    log "fetching Kafka 3.9.1 jars from Maven Central"
    mkdir -p "$kafka_dir/libs"
    mvn -q -f "$root/scripts/kafka/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$kafka_dir/libs" -DincludeScope=runtime >"$dir/mvn.log" 2>&1 \
      || { tail -20 "$dir/mvn.log" >&2; log "could not fetch Kafka's jars"; exit 1; }
    touch "$kafka_dir/libs/.complete"
  fi
}

start_redis() {
  if port_open "$REDIS_PORT"; then
    if started_here "$redis_dir/redis.pid" "$REDIS_PORT"; then log "redis already up on $REDIS_PORT"; return; fi
    not_ours redis "$REDIS_PORT"; return
  fi
  mkdir -p "$redis_dir"
  echo "$REDIS_PORT" >"$redis_dir/redis.pid.port"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --daemonize yes --dir "$redis_dir" \
    --pidfile "$redis_dir/redis.pid" --logfile "$redis_dir/redis.log" --save "" --appendonly no
  for _ in $(seq 1 50); do port_open "$REDIS_PORT" && { log "redis up on $REDIS_PORT"; return; }; sleep 0.1; done
  log "redis did not start (see $redis_dir/redis.log)"; exit 1
}

# A certificate authority, a broker certificate for 127.0.0.1 and a client certificate, all
# self-made for the tests; the broker keeps its key in a PKCS#12 keystore and trusts the CA's PEM.
make_tls() {
  [ -f "$tls_dir/.complete" ] && return
  mkdir -p "$tls_dir"
  (
    cd "$tls_dir"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=fairstream test CA" \
      -keyout ca.key -out ca.pem 2>/dev/null
    for who in broker client; do
      openssl req -newkey rsa:2048 -nodes -subj "/CN=fairstream-$who" -keyout "$who.key" -out "$who.csr" 2>/dev/null
      printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$who.ext"
      openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile "$who.ext" -out "$who.pem" 2>/dev/null
    done
    openssl pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name broker \
      -out broker.p12 -passout "pass:$TLS_PASS"
  )
  touch "$tls_dir/.complete"
}

start_kafka() {
  if port_open "$KAFKA_PORT"; then
    started_here "$kafka_dir/kafka.pid" "$KAFKA_PORT" || not_ours kafka "$KAFKA_PORT"
    for port in "$SASL_PORT" "$SSL_PORT" "$SASL_SSL_PORT"; do
      port_open "$port" || log "warning: kafka on $KAFKA_PORT has no listener on $port (started elsewhere? restart it with: $0 stop && $0 start)"
    done
    log "kafka already answering on $KAFKA_PORT"; return
  fi
  mkdir -p "$kafka_dir/data"
  make_tls
  # Where this broker's test CA lives, for tests of another checkout that find it running.
  echo "$tls_dir" >"${TMPDIR:-/tmp}/fairstream-kafka-tls-dir"
  cat >"$kafka_dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT,SASL_PLAINTEXT://127.0.0.1:$SASL_PORT,SSL://127.0.0.1:$SSL_PORT,SASL_SSL://127.0.0.1:$SASL_SSL_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_PLAINTEXT://127.0.0.1:$SASL_PORT,SSL://127.0.0.1:$SSL_PORT,SASL_SSL://127.0.0.1:$SASL_SSL_PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" user_admin="admin-secret" user_fairstream="fairstream-test-secret";
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" user_admin="admin-secret" user_fairstream="fairstream-test-secret";
ssl.keystore.type=PKCS12
ssl.keystore.location=$tls_dir/broker.p12
ssl.keystore.password=$TLS_PASS
ssl.key.password=$TLS_PASS
ssl.truststore.type=PEM
ssl.truststore.location=$tls_dir/ca.pem
listener.name.ssl.ssl.client.auth=required
inter.broker.listener.name=PLAINTEXT
log.dirs=$kafka_dir/data
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
message.max.bytes=1048576
EOF
  cat >"$kafka_dir/log4j.properties" <<EOF
log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$kafka_dir/kafka.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
  local java_opts=(-Xms256m -Xmx768m -Dlog4j.configuration="file:$kafka_dir/log4j.properties" -cp "$kafka_dir/libs/*")
  if [ ! -f "$kafka_dir/data/meta.properties" ]; then
    local cluster_id
    cluster_id="$(java "${java_opts[@]}" kafka.tools.StorageTool random-uuid)"
    java "${java_opts[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$kafka_dir/server.properties" >/dev/null
  fi
  nohup java "${java_opts[@]}" kafka.Kafka "$kafka_dir/server.properties" >"$kafka_dir/stdout.log" 2>&1 &
  echo $! >"$kafka_dir/kafka.pid"
  echo "$KAFKA_PORT" >"$kafka_dir/kafka.pid.port"
  # Up to 180 s: on a busy 2-core machine the JVM once took over 60 s to come back (the
  # kafka-restart drill, with tests and a benchmark beside it).
  for _ in $(seq 1 1800); do
    if port_open "$KAFKA_PORT" && port_open "$SASL_PORT" && port_open "$SSL_PORT" && port_open "$SASL_SSL_PORT"; then
      log "kafka up on $KAFKA_PORT (SASL/PLAIN on $SASL_PORT, mutual TLS on $SSL_PORT, SASL over TLS on $SASL_SSL_PORT)"; return
    fi
    kill -0 "$(cat "$kafka_dir/kafka.pid")" 2>/dev/null || break
    sleep 0.1
  done
  tail -20 "$kafka_dir/stdout.log" "$kafka_dir/kafka.log" >&2 2>/dev/null || true
  log "kafka did not start"; exit 1
}

stop_one() {
  local name="$1" pidfile="$2" pid
  pid="$(cat "$pidfile" 2>/dev/null || true)"  # read once: redis removes its own pidfile on exit
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    log "$name stopped"
  fi
  rm -f "$pidfile" "$pidfile.port"
}

case "${1:-}" in
  start)
    ensure_tools
    start_redis
    start_kafka
    ;;
  stop)
    stop_one kafka "$kafka_dir/kafka.pid"
    stop_one redis "$redis_dir/redis.pid"
    ;;
  restart-kafka|freeze-kafka|thaw-kafka)
    # restart-kafka: the chaos drill's "Kafka restart" (fairstream drill kafka-restart), its data
    # kept; freeze-kafka / thaw-kafka: the broker paused (SIGSTOP) and resumed (SIGCONT), as a
    # broker stuck in a long GC pause or on a host that froze (the producers' outage test).
    if started_here "$kafka_dir/kafka.pid" "$KAFKA_PORT"; then
      case "$1" in
        restart-kafka) stop_one kafka "$kafka_dir/kafka.pid"; start_kafka ;;
        freeze-kafka) kill -STOP "$(cat "$kafka_dir/kafka.pid")"; log "kafka on $KAFKA_PORT frozen" ;;
        thaw-kafka) kill -CONT "$(cat "$kafka_dir/kafka.pid")"; log "kafka on $KAFKA_PORT thawed" ;;
      esac
      exit 0
    fi
    # Not started here: acted on only if told to, through the checkout whose services.sh did.
    if [ "${FAIRSTREAM_SERVICES_REUSE:-0}" != 1 ]; then
      log "kafka on 127.0.0.1:$KAFKA_PORT was not started by this checkout: not acting on it (FAIRSTREAM_SERVICES_REUSE=1 acts on another checkout's)"
      exit 1
    fi
    owner=""
    for pid in $(pgrep -f 'kafka\.Kafka ' || true); do
      props="$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | tail -n 1)"
      if [[ "$props" == */.services/kafka/server.properties ]] && grep -q "PLAINTEXT://127.0.0.1:$KAFKA_PORT," "$props" 2>/dev/null; then
        owner="${props%/.services/kafka/server.properties}"
      fi
    done
    if [ -z "$owner" ] || [ "$owner" = "$root" ] || [ ! -f "$owner/scripts/services.sh" ]; then
      log "kafka on $KAFKA_PORT was not started by a checkout's scripts/services.sh: not acting on it"; exit 1
    fi
    log "kafka on $KAFKA_PORT belongs to $owner: $1 there"
    exec bash "$owner/scripts/services.sh" "$1"
    ;;
  status)
    port_open "$KAFKA_PORT" && echo "kafka: up (127.0.0.1:$KAFKA_PORT)" || echo "kafka: down"
    port_open "$REDIS_PORT" && echo "redis: up (127.0.0.1:$REDIS_PORT)" || echo "redis: down"
    ;;
  *)
    echo "usage: $0 start|stop|status|restart-kafka|freeze-kafka|thaw-kafka" >&2
    exit 2
    ;;
esac
