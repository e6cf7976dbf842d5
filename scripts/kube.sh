#!/usr/bin/env bash
# A real Kubernetes control plane for the connector's tests and benchmark, on loopback:
#   etcd 3.7.0 (go.etcd.io/etcd/server/v3), kube-apiserver 1.37.2 (k8s.io/kubernetes) and kwok
#   0.8.0, which plays the kubelets (nodes Ready, bound pods Running, a pod Succeeded after the
#   run time in its annotation pod-complete.stage.kwok.x-k8s.io/delay); kube-scheduler 1.37.2
#   is built too, for `fairstream bench kubernetes` to compare with, and kubectl, for the README's
#   commands as a user runs them.
# Usage: scripts/kube.sh build|start|stop|stop-apiserver|status|kubeconfig|bin
#   build       builds the five binaries with `go` from scripts/kube/go.mod into a cache outside
#               the checkout (FAIRSTREAM_KUBE_CACHE, default ~/.cache/fairstream/kube/<versions>):
#               about 7.5 minutes and 2.5 GB of memory on 2 cores the first time, nothing after.
#   start       builds if needed, then starts what is not running: a throw-away CA and serving
#               certificate, a static admin token (and the connector's: a ServiceAccount's name,
#               so the RBAC of deploy/kubernetes/ is what it gets), RBAC on; with no controller
#               manager, the admission plugins ServiceAccount (nothing makes their tokens) and
#               TaintNodesByCondition (nothing would take the not-ready taint off a new node) off.
#               The GenericWorkload feature gate and scheduling.k8s.io/v1beta1 are on: PodGroups
#               (beta in 1.37, off by default), which the connector reads for gangs.
#   kubeconfig  prints the admin kubeconfig's path (.services/kube/admin.kubeconfig).
# Ports: FAIRSTREAM_ETCD_PORT (23790; peer +1), FAIRSTREAM_APISERVER_PORT (16443). State, logs
# and pids in .services/kube/ (git-ignored); etcd's data is thrown away at each start.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/.services/kube"
ETCD_PORT="${FAIRSTREAM_ETCD_PORT:-23790}"
APISERVER_PORT="${FAIRSTREAM_APISERVER_PORT:-16443}"
# What is built, and from which versions: a change to either builds again, into a new folder.
BINARIES="k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl sigs.k8s.io/kwok/cmd/kwok ./etcd"
key="$({ echo "$BINARIES"; cat "$root/scripts/kube/go.mod" "$root/scripts/kube/go.sum" "$root/scripts/kube/etcd/main.go"; } | sha256sum | cut -c1-12)"
cache="${FAIRSTREAM_KUBE_CACHE:-$HOME/.cache/fairstream/kube}/$key"
bin="$cache/bin"
ADMIN_TOKEN="fairstream-test-admin-token"          # a throw-away control plane's, nothing else
CONNECTOR_TOKEN="fairstream-test-connector-token"  # the ServiceAccount fairstream/fairstream-connector's

log() { echo "kube: $*" >&2; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
alive() { local pid; pid="$(cat "$1" 2>/dev/null || true)"; [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }

build() {
  if [ -f "$bin/.complete" ]; then return; fi
  command -v go >/dev/null || { log "needs the go command (https://go.dev/dl) to build the control plane"; exit 1; }
  log "building etcd, kube-apiserver, kube-scheduler, kubectl and kwok into $bin (about 7.5 minutes the first time; log: $cache/build.log)"
  mkdir -p "$cache"
  rm -rf "$cache/bin.new"
  mkdir -p "$cache/bin.new"
  # (Put in place whole: a start during a build finds no half of one.)
  # shellcheck disable=SC2086
  if ! (cd "$root/scripts/kube" && go build -trimpath -o "$cache/bin.new/" $BINARIES) >"$cache/build.log" 2>&1; then
    tail -20 "$cache/build.log" >&2; log "the build failed (log: $cache/build.log)"; exit 1
  fi
  touch "$cache/bin.new/.complete"
  rm -rf "$bin"
  mv "$cache/bin.new" "$bin"
  log "built"
}

make_certs() {
  [ -f "$dir/pki/.complete" ] && return
  mkdir -p "$dir/pki"
  (
    cd "$dir/pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=fairstream test kubernetes CA" \
      -keyout ca.key -out ca.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key -out apiserver.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n' >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile apiserver.ext -out apiserver.pem 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
  touch "$dir/pki/.complete"
}

kubeconfig() {  # $1: file, $2: token, $3: user name
  cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: fairstream-test
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $dir/pki/ca.pem
users:
- name: $3
  user:
    token: $2
contexts:
- name: fairstream-test
  context: {cluster: fairstream-test, user: $3}
current-context: fairstream-test
KC
}

start_etcd() {
  if alive "$dir/etcd.pid"; then return; fi
  port_open "$ETCD_PORT" && { log "127.0.0.1:$ETCD_PORT answers but is not this checkout's etcd: set FAIRSTREAM_ETCD_PORT"; exit 1; }
  rm -rf "$dir/etcd-data"
  nohup "$bin/etcd" --name fairstream-test --data-dir "$dir/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "fairstream-test=http://127.0.0.1:$((ETCD_PORT + 1))" \
    --unsafe-no-fsync --quota-backend-bytes 4294967296 --log-level warn >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
  for _ in $(seq 1 100); do port_open "$ETCD_PORT" && { log "etcd up on $ETCD_PORT"; return; }; sleep 0.1; done
  tail -20 "$dir/etcd.log" >&2; log "etcd did not start"; exit 1
}

start_apiserver() {
  if alive "$dir/apiserver.pid"; then return; fi
  port_open "$APISERVER_PORT" && { log "127.0.0.1:$APISERVER_PORT answers but is not this checkout's kube-apiserver: set FAIRSTREAM_APISERVER_PORT"; exit 1; }
  cat >"$dir/tokens.csv" <<TOK
$ADMIN_TOKEN,fairstream-admin,fairstream-admin,system:masters
$CONNECTOR_TOKEN,system:serviceaccount:fairstream:fairstream-connector,fairstream-connector-uid,"system:serviceaccounts,system:serviceaccounts:fairstream,system:authenticated"
TOK
  nohup "$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
    --tls-cert-file "$dir/pki/apiserver.pem" --tls-private-key-file "$dir/pki/apiserver.key" \
    --token-auth-file "$dir/tokens.csv" --authorization-mode RBAC \
    --service-account-key-file "$dir/pki/sa.pub" --service-account-signing-key-file "$dir/pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.96.0.0/16 \
    --disable-admission-plugins ServiceAccount,TaintNodesByCondition --enable-priority-and-fairness=false --endpoint-reconciler-type none \
    --feature-gates GenericWorkload=true --runtime-config scheduling.k8s.io/v1beta1=true \
    --max-requests-inflight 2000 --max-mutating-requests-inflight 1000 \
    --cert-dir "$dir/pki" >"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  for _ in $(seq 1 600); do
    if curl -sf --cacert "$dir/pki/ca.pem" -H "Authorization: Bearer $ADMIN_TOKEN" \
        "https://127.0.0.1:$APISERVER_PORT/readyz" >/dev/null 2>&1; then
      log "kube-apiserver ready on $APISERVER_PORT"; return
    fi
    alive "$dir/apiserver.pid" || break
    sleep 0.1
  done
  tail -30 "$dir/apiserver.log" >&2; log "kube-apiserver did not become ready"; exit 1
}

start_kwok() {
  if alive "$dir/kwok.pid"; then return; fi
  nohup "$bin/kwok" --kubeconfig "$dir/admin.kubeconfig" --config "$root/scripts/kube/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-label-selector "type=kwok" \
    --server-address "" >"$dir/kwok.log" 2>&1 &
  echo $! >"$dir/kwok.pid"
  sleep 0.2
  alive "$dir/kwok.pid" || { tail -20 "$dir/kwok.log" >&2; log "kwok did not start"; exit 1; }
  log "kwok up (nodes labelled type=kwok)"
}

stop_one() {
  local pid; pid="$(cat "$dir/$1.pid" 2>/dev/null || true)"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    log "$1 stopped"
  fi
  rm -f "$dir/$1.pid"
}

case "${1:-}" in
  build) build ;;
  start)
    build
    mkdir -p "$dir"
    make_certs
    kubeconfig "$dir/admin.kubeconfig" "$ADMIN_TOKEN" fairstream-admin
    kubeconfig "$dir/connector.kubeconfig" "$CONNECTOR_TOKEN" fairstream-connector
    echo "$bin" >"$dir/bin.path"
    # A stopped etcd takes its data with it: a kube-apiserver of the old one goes first.
    alive "$dir/etcd.pid" || { stop_one kwok; stop_one apiserver; }
    start_etcd
    start_apiserver
    start_kwok
    ;;
  stop) stop_one kwok; stop_one apiserver; stop_one etcd ;;
  stop-apiserver) stop_one apiserver ;;  # (a drill: the API server away; `start` brings it back, etcd's data kept)
  status)
    for name in etcd apiserver kwok; do alive "$dir/$name.pid" && echo "$name: up" || echo "$name: down"; done ;;
  kubeconfig) echo "$dir/admin.kubeconfig" ;;
  bin) echo "$bin" ;;
  *) echo "usage: $0 build|start|stop|stop-apiserver|status|kubeconfig|bin" >&2; exit 2 ;;
esac
