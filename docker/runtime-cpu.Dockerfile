# The runtime image of the cpu target: the runtime base (Python, torch +cpu),
# the patched vLLM wheel, the engine wheel and the native launcher, nothing
# else of ours. It serves vLLM's OpenAI-compatible API with ActiveKV on:
#   docker run --network host --shm-size 1g -v DIR:/models/m:ro IMAGE --model /models/m --host 127.0.0.1 --port 8000
# (vLLM's CPU engine needs more shared memory than docker's default 64 MiB).
# vLLM compiles the model with inductor at start-up (its default mode; the
# base has the g++ and Python headers this needs), keeping the kernels under
# /root/.cache/vllm (a volume there shortens restarts); --enforce-eager skips it.
# vLLM's flags follow the image name, with activekv-serve's own
# (--activekv-mode, --activekv-capacity, --activekv-config FILE.json).
ARG RUNTIME_BASE
FROM ${RUNTIME_BASE}

COPY wheels/ /tmp/activekv-wheels/
COPY constraints.txt /tmp/activekv-constraints.txt
COPY launcher/activekv-serve /opt/venv/bin/activekv-serve
# vLLM's dependencies that cannot load beside torch +cpu (release.toml
# [targets.cpu] broken_beside_torch keeps the list).
ARG BROKEN_BESIDE_TORCH
RUN set -eux; \
    pip install /tmp/activekv-wheels/*.whl -c /tmp/activekv-constraints.txt; \
    if [ -n "${BROKEN_BESIDE_TORCH}" ]; then pip uninstall --yes ${BROKEN_BESIDE_TORCH}; fi; \
    python -c "import torch, vllm, activekv; activekv.ActiveKVConnector"; \
    rm -rf /tmp/activekv-wheels /tmp/activekv-constraints.txt /root/.cache/pip

# Declared here, after the install, so a new commit reuses the install layer.
ARG RELEASE_VERSION
ARG MANIFEST_INPUTS
ENV VLLM_CPU_KVCACHE_SPACE=1
LABEL org.opencontainers.image.title="activekv-runtime-cpu" \
      org.opencontainers.image.version="${RELEASE_VERSION}" \
      org.activekv.manifest-inputs="${MANIFEST_INPUTS}"
ENTRYPOINT ["/opt/venv/bin/activekv-serve"]
