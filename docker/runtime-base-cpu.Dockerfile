# Runtime base for the cpu target: Debian, CPython and torch +cpu in a venv on
# PATH, no compilers. The payload audit imports the wheels here; the runtime
# image (vLLM and the engine) is built on it.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON_VERSIONS
ARG TORCH
ARG INDEX_URL
ARG TORCH_INDEX_URL
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    PIP_CERT=/usr/local/share/activekv/ca-bundle.crt \
    PATH=/opt/venv/bin:$PATH

COPY ca-bundle.crt /usr/local/share/activekv/ca-bundle.crt
COPY wheelhouse/ /wheelhouse/
COPY install-torch.sh /usr/local/share/activekv/install-torch.sh
RUN set -eux; \
    v="$(echo ${PYTHON_VERSIONS} | cut -d' ' -f1)"; \
    apt-get update; \
    apt-get install -y --no-install-recommends "python$v" "python$v-venv" "libpython$v" libgomp1 libnuma1; \
    rm -rf /var/lib/apt/lists/*; \
    "python$v" -m venv /opt/venv; \
    sh /usr/local/share/activekv/install-torch.sh /opt/venv/bin/python "${TORCH}" "${INDEX_URL}" "${TORCH_INDEX_URL}"; \
    rm -rf /wheelhouse /root/.cache/pip
