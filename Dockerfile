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
# The engine's fused CPU kernels, compiled here so engine pods need no compiler: one
# build per instruction set, and each pod loads the one torch dispatches to on its CPU
# (native_kernels.cpu_isa).
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/* \
    && PATH=/opt/venv/bin:$PATH /opt/venv/bin/python -m slopilot.engine.executors.native_kernels build \
        --isa avx512 --isa avx2 --isa generic --dir /opt/venv/share/slopilot-kernels

FROM python:3.11.14-slim-bookworm AS runtime
# A fixed numeric UID/GID: Kubernetes can only verify runAsNonRoot for numeric users.
RUN groupadd --system --gid 10001 slopilot \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --shell /usr/sbin/nologin slopilot
COPY --from=build /opt/venv /opt/venv
# The torch engine runs with tcmalloc and Intel's OpenMP runtime preloaded, as vLLM's CPU
# guide asks of vLLM: on a shared CPU the Intel runtime's barriers cut the decode step
# several-fold (docs/benchmarks.md, serving throughput). intel-openmp comes with the
# engine extra (x86-64 only); the links give LD_PRELOAD one path whatever the arch.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libtcmalloc-minimal4 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /opt/preload \
    && ln -s "$(ldconfig -p | awk '/libtcmalloc_minimal\.so\.4 /{print $NF; exit}')" \
        /opt/preload/libtcmalloc_minimal.so.4 \
    && if [ -f /opt/venv/lib/libiomp5.so ]; then ln -s /opt/venv/lib/libiomp5.so /opt/preload/; fi
ENV LD_PRELOAD=/opt/preload/libtcmalloc_minimal.so.4:/opt/preload/libiomp5.so
ENV SLOPILOT_KERNEL_DIR=/opt/venv/share/slopilot-kernels
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 10001:10001
WORKDIR /tmp
# 8000: the engine's OpenAI-compatible HTTP; 8080: the operator's liveness endpoint.
EXPOSE 8000 8080
CMD ["slopilot", "--help"]
