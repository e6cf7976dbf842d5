# fairstream's worker and tools (the image docker-compose.yml builds).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY fairstream fairstream
COPY policies policies
COPY state state
COPY streams streams
COPY producers producers
COPY kube kube
# The compiled pass's sources: this image has no Rust toolchain, so the install goes on without
# it and every pass runs in Python (fairstream/core/native.py).
COPY native/Cargo.toml native/Cargo.lock native/
COPY native/src native/src
COPY examples examples
COPY tests/data tests/data
# Without the lab extra (plots, progress bars, FLEX training): the worker and the agents never
# import it; `simulate --no-plots` runs here. With the kubernetes extra: the same image runs
# the Kubernetes connector (deploy/kubernetes/).
RUN pip install --no-cache-dir ".[kubernetes]"
ENTRYPOINT ["fairstream"]
