# The runtime image of the cpu target: the runtime base (Python, torch +cpu)
# with vLLM's dependencies (docker/runtime-dependencies.Dockerfile), the
# patched vLLM wheel, the engine wheel and the native launcher, nothing
# else of ours. It serves vLLM's OpenAI-compatible API with ActiveKV on:
#   docker run --network host --shm-size 1g -v DIR:/models/m:ro IMAGE --model /models/m --host 127.0.0.1 --port 8000
# (vLLM's CPU engine needs more shared memory than docker's default 64 MiB).
# vLLM compiles the model with inductor at start-up (its default mode; the
# base has the g++ and Python headers this needs), keeping the kernels under
# /root/.cache/vllm (a volume there shortens restarts); --enforce-eager skips it.
# vLLM's flags follow the image name, with activekv-serve's own
# (--activekv-mode, --activekv-capacity, --activekv-config FILE.json).
ARG RUNTIME_DEPENDENCIES
FROM ${RUNTIME_DEPENDENCIES}

# Ours, without dependencies (all are in the image below): pip check may
# name only broken_beside_torch's packages (removed there) as missing.
ARG BROKEN_BESIDE_TORCH
COPY wheels/ /tmp/activekv-wheels/
COPY launcher/activekv-serve /opt/venv/bin/activekv-serve
RUN set -eux; \
    pip install --no-deps /tmp/activekv-wheels/*.whl; \
    pip check > /tmp/pip-check.txt || true; \
    removed="$(echo ${BROKEN_BESIDE_TORCH:-none} | tr ' ' '|')"; \
    if grep -v -E "^No broken requirements found|requires (${removed}), which is not installed" /tmp/pip-check.txt; then \
        echo "the image's packages do not satisfy each other (above)"; exit 1; fi; \
    python -c "import torch, vllm, activekv; activekv.ActiveKVHostConnector"; \
    rm -rf /tmp/activekv-wheels /tmp/pip-check.txt /root/.cache/pip

# Declared last: they change with every release, the layers above need not.
ARG RELEASE_VERSION
ARG MANIFEST_INPUTS
ENV VLLM_CPU_KVCACHE_SPACE=1
LABEL org.opencontainers.image.title="activekv-runtime-cpu" \
      org.opencontainers.image.version="${RELEASE_VERSION}" \
      org.activekv.manifest-inputs="${MANIFEST_INPUTS}"
ENTRYPOINT ["/opt/venv/bin/activekv-serve"]
