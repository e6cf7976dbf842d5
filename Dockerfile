# fairstream's worker and tools (the image docker-compose.yml builds).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY fairstream fairstream
COPY policies policies
COPY state state
COPY streams streams
COPY producers producers
COPY examples examples
COPY tests/data tests/data
RUN pip install --no-cache-dir .
ENTRYPOINT ["fairstream"]
