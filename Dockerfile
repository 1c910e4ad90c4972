# One image serves both deployable parts of slopilot:
#   engine pods:   slopilot serve --executor torch --model ... --config /etc/slopilot/engine.json
#   operator pod:  slopilot operator --liveness=http://0.0.0.0:8080/healthz ...
# It carries the engine, tuner and operator extras (the operator imports the tuner).
# The base is pinned to a patch release; bump it deliberately.

FROM python:3.11.14-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY slopilot ./slopilot
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install ".[engine,tuner,operator,postgres]"

FROM python:3.11.14-slim-bookworm AS runtime
# A fixed numeric UID/GID: Kubernetes can only verify runAsNonRoot for numeric users.
RUN groupadd --system --gid 10001 slopilot \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --shell /usr/sbin/nologin slopilot
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 10001:10001
WORKDIR /tmp
# 8000: the engine's OpenAI-compatible HTTP; 8080: the operator's liveness endpoint.
EXPOSE 8000 8080
CMD ["slopilot", "--help"]
