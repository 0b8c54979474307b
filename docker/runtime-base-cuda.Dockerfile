# Runtime base for the cuda targets: Debian, CPython and the PyPI torch CUDA
# build with its CUDA runtime wheels (nvidia-*, triton: GBs), no compilers and
# no GPU needed to build. The payload audit imports the wheels here (an ABI
# mismatch with torch shows without a device); the runtime image
# (docker/runtime-cuda.Dockerfile) adds vLLM and ours.
#
# The target's first Python: Debian's where bookworm has it, else the one the
# target's builder compiled from its pinned source (3.12, the cuda release's:
# /opt/cpython/<version>, with its shared library for activekv-serve).
ARG BASE_IMAGE
ARG BUILDER_IMAGE
FROM ${BUILDER_IMAGE} AS builder

FROM ${BASE_IMAGE}

ARG PYTHON_VERSIONS
ARG TORCH
ARG INDEX_URL
ARG TORCH_INDEX_URL
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    PIP_CERT=/usr/local/share/activekv/ca-bundle.crt \
    PATH=/opt/venv/bin:$PATH

COPY --from=builder /opt/cpython/ /opt/cpython/
COPY ca-bundle.crt /usr/local/share/activekv/ca-bundle.crt
COPY wheelhouse/ /wheelhouse/
COPY install-torch.sh /usr/local/share/activekv/install-torch.sh
RUN set -eux; \
    v="$(echo ${PYTHON_VERSIONS} | cut -d' ' -f1)"; \
    apt-get update; \
    if [ -x "/opt/cpython/$v/bin/python$v" ]; then \
      apt-get install -y --no-install-recommends libgomp1 libssl3 libffi8 libsqlite3-0 libbz2-1.0 \
          liblzma5 zlib1g libuuid1; \
      find /opt/cpython -mindepth 1 -maxdepth 1 ! -name "$v" -exec rm -rf {} +; \
      echo "/opt/cpython/$v/lib" > /etc/ld.so.conf.d/activekv-cpython.conf; ldconfig; \
      python="/opt/cpython/$v/bin/python$v"; \
    else \
      rm -rf /opt/cpython; \
      apt-get install -y --no-install-recommends "python$v" "python$v-venv" "libpython$v" libgomp1; \
      python="python$v"; \
    fi; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    "$python" -m venv /opt/venv; \
    sh /usr/local/share/activekv/install-torch.sh /opt/venv/bin/python "${TORCH}" "${INDEX_URL}" "${TORCH_INDEX_URL}"; \
    rm -rf /wheelhouse /root/.cache/pip; \
    python -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
