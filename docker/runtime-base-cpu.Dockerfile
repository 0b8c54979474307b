# Runtime base for the cpu target: Debian, CPython and torch +cpu in a venv on
# PATH, and what torch's compiler needs to run: vLLM's compiled mode (its
# default) has inductor generate C++ kernels at start-up and build them with
# g++ against Python.h. The payload audit imports the wheels here; the runtime
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
# g++ (which brings libc6-dev) and libpython3.X-dev (Python.h of the image's
# Python, where the venv's sysconfig looks) are what inductor's CPU kernels
# need; without them vLLM's worker dies at start-up (InvalidCxxCompiler, then
# "Python.h: No such file"). The last step compiles a function with inductor
# and runs it, so an image that cannot serve in compiled mode fails here; its
# cache goes (the precompiled header alone is 150 MB, made for this build
# host's vector ISA), as do apt's downloaded packages.
RUN set -eux; \
    v="$(echo ${PYTHON_VERSIONS} | cut -d' ' -f1)"; \
    apt-get update; \
    apt-get install -y --no-install-recommends "python$v" "python$v-venv" "libpython$v" libgomp1 libnuma1 \
        g++ "libpython$v-dev"; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    "python$v" -m venv /opt/venv; \
    sh /usr/local/share/activekv/install-torch.sh /opt/venv/bin/python "${TORCH}" "${INDEX_URL}" "${TORCH_INDEX_URL}"; \
    rm -rf /wheelhouse /root/.cache/pip; \
    python -c "import torch; \
f = torch.compile(lambda x: torch.sin(x) + 2 * x, fullgraph=True, backend='inductor'); \
x = torch.arange(8.0); torch.testing.assert_close(f(x), torch.sin(x) + 2 * x); \
print('torch.compile (inductor, cpu) works')"; \
    rm -rf /tmp/torchinductor_*
