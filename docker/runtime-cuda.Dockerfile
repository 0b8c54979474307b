# The runtime image of the cuda target: the runtime base (CPython 3.12, torch
# 2.14.0 with its CUDA libraries from PyPI) with vLLM's dependencies at the
# hash-pinned packaging/cuda/constraints.txt (docker/runtime-dependencies.Dockerfile),
# the patched vLLM wheel, the engine wheel and the native launcher, nothing
# else of ours. Built on a host without a GPU; run with one:
#   docker run --gpus all --network host --ipc host -v DIR:/models/m:ro IMAGE --model /models/m --host 127.0.0.1 --port 8000
# vLLM's flags follow the image name, with activekv-serve's own
# (--activekv-mode, --activekv-capacity, --activekv-config FILE.json).
ARG RUNTIME_DEPENDENCIES
FROM ${RUNTIME_DEPENDENCIES}

# Ours, without dependencies (all are in the image below). pip check may name
# only what the pins say on purpose: broken_beside_torch's packages (removed)
# and packaging/cuda/overrides.toml's versions (PIP_CHECK_ALLOWED, an ERE).
ARG BROKEN_BESIDE_TORCH
ARG PIP_CHECK_ALLOWED
COPY wheels/ /tmp/activekv-wheels/
COPY launcher/activekv-serve /opt/venv/bin/activekv-serve
RUN set -eux; \
    pip install --no-deps /tmp/activekv-wheels/*.whl; \
    pip check > /tmp/pip-check.txt || true; \
    allowed="^No broken requirements found"; \
    if [ -n "${BROKEN_BESIDE_TORCH}" ]; then \
        allowed="$allowed|requires ($(echo ${BROKEN_BESIDE_TORCH} | tr ' ' '|')), which is not installed"; fi; \
    if [ -n "${PIP_CHECK_ALLOWED}" ]; then allowed="$allowed|${PIP_CHECK_ALLOWED}"; fi; \
    if grep -v -E "$allowed" /tmp/pip-check.txt; then \
        echo "the image's packages do not satisfy each other (above)"; exit 1; fi; \
    if ldd /opt/venv/bin/activekv-serve | grep "not found"; then \
        echo "activekv-serve cannot find a library it needs (above)"; exit 1; fi; \
    python -c "import torch, vllm, activekv; activekv.ActiveKVConnector; print('torch', torch.__version__, 'vllm', vllm.__version__)"; \
    rm -rf /tmp/activekv-wheels /tmp/pip-check.txt /root/.cache/pip

# Declared last: they change with every release, the layers above need not.
ARG RELEASE_VERSION
ARG MANIFEST_INPUTS
LABEL org.opencontainers.image.title="activekv-runtime-cuda" \
      org.opencontainers.image.version="${RELEASE_VERSION}" \
      org.activekv.manifest-inputs="${MANIFEST_INPUTS}"
ENTRYPOINT ["/opt/venv/bin/activekv-serve"]
