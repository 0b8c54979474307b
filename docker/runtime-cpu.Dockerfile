# The runtime image of the cpu target: the runtime base (Python, torch +cpu),
# the patched vLLM wheel and the engine wheel, and nothing else of ours. It
# serves vLLM's OpenAI-compatible API with ActiveKV on by default:
#   docker run --network host IMAGE --model /models/m --host 127.0.0.1 --port 8000
# Extra vLLM flags follow the image name; ACTIVEKV_KV_TRANSFER_CONFIG replaces
# the default connector settings (JSON, as vLLM's --kv-transfer-config).
ARG RUNTIME_BASE
FROM ${RUNTIME_BASE}

COPY wheels/ /tmp/activekv-wheels/
COPY constraints.txt /tmp/activekv-constraints.txt
RUN set -eux; \
    pip install /tmp/activekv-wheels/*.whl -c /tmp/activekv-constraints.txt; \
    pip uninstall --yes torchvision torchaudio torchcodec || true; \
    python -c "import torch, vllm, activekv; activekv.ActiveKVConnector"; \
    rm -rf /tmp/activekv-wheels /tmp/activekv-constraints.txt /root/.cache/pip

# Declared here, after the install, so a new commit reuses the install layer.
ARG RELEASE_VERSION
ARG MANIFEST_INPUTS
ENV ACTIVEKV_KV_TRANSFER_CONFIG='{"kv_connector":"ActiveKVConnector","kv_role":"kv_both"}' \
    VLLM_CPU_KVCACHE_SPACE=1
LABEL org.opencontainers.image.title="activekv-runtime-cpu" \
      org.opencontainers.image.version="${RELEASE_VERSION}" \
      org.activekv.manifest-inputs="${MANIFEST_INPUTS}"
# vllm-cpu 0.32.0's `vllm` command asks for the metadata of a distribution
# named "vllm" and fails; its OpenAI server module takes the same flags.
ENTRYPOINT ["sh", "-c", "exec python -m vllm.entrypoints.openai.api_server \"$@\" --kv-transfer-config \"$ACTIVEKV_KV_TRANSFER_CONFIG\"", "activekv-serve"]
