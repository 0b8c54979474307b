# Runtime base for the xpu target: pypa's manylinux_2_28 image (the builder's
# base) with torch +xpu and the wheels it depends on in a venv, and nothing
# else: no compilers, and not Intel's GPU user-space driver (the Level Zero
# loader and compute runtime), which a host or image that runs on an Arc GPU
# must add. The payload audit would import the wheels here. Never built yet
# (no oneAPI base or Intel GPU was reachable), and no runtime image is built
# on it: the runtime-image stage has no xpu recipe.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON_VERSIONS
ARG TORCH
ARG INDEX_URL
ARG TORCH_INDEX_URL
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    PIP_CERT=/etc/pki/tls/certs/ca-bundle.crt \
    PATH=/opt/venv/bin:$PATH

COPY ca-bundle.crt /etc/pki/ca-trust/source/anchors/activekv-extra.crt
COPY wheelhouse/ /wheelhouse/
COPY install-torch.sh /usr/local/share/activekv/install-torch.sh
RUN set -eux; \
    update-ca-trust; \
    v="$(echo ${PYTHON_VERSIONS} | cut -d' ' -f1)"; tag="cp$(echo "$v" | tr -d .)"; \
    "/opt/python/$tag-$tag/bin/python" -m venv /opt/venv; \
    sh /usr/local/share/activekv/install-torch.sh /opt/venv/bin/python "${TORCH}" "${INDEX_URL}" "${TORCH_INDEX_URL}"; \
    rm -rf /wheelhouse /root/.cache/pip
