# Builder for the xpu target (production): pypa's manylinux_2_28 image (pinned
# by digest in release.toml; it already has /opt/python/cpXY-cpXY and
# auditwheel), Intel oneAPI Deep Learning Essentials from Intel's repository,
# and torch +xpu from the PyTorch XPU index. The oneAPI environment that
# setvars.sh would make is written into ENV, because cibuildwheel runs every
# build command with the image's environment, not through a login shell.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

ARG PYTHON_VERSIONS
ARG TORCH
ARG INDEX_URL
ARG TORCH_INDEX_URL
ARG ONEAPI_VERSION=2025.2
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    PIP_CERT=/etc/pki/tls/certs/ca-bundle.crt \
    SKBUILD_CMAKE_DEFINE=ACTIVEKV_TORCH_CMAKE=OFF

# The extra CA bundle joins the system's trust (dnf and pip both use it).
COPY ca-bundle.crt /etc/pki/ca-trust/source/anchors/activekv-extra.crt
RUN set -eux; \
    update-ca-trust; \
    printf '%s\n' '[oneAPI]' 'name=Intel oneAPI repository' \
      'baseurl=https://yum.repos.intel.com/oneapi' 'enabled=1' 'gpgcheck=1' 'repo_gpgcheck=1' \
      'gpgkey=https://yum.repos.intel.com/intel-gpg-keys/GPG-PUB-KEY-INTEL-SW-PRODUCTS.PUB' \
      > /etc/yum.repos.d/oneAPI.repo; \
    dnf install -y "intel-deep-learning-essentials-${ONEAPI_VERSION}" ccache; \
    dnf clean all

ENV ONEAPI_ROOT=/opt/intel/oneapi
ENV CMPLR_ROOT=${ONEAPI_ROOT}/compiler/latest \
    MKLROOT=${ONEAPI_ROOT}/mkl/latest \
    TBBROOT=${ONEAPI_ROOT}/tbb/latest \
    UMF_ROOT=${ONEAPI_ROOT}/umf/latest
ENV PATH=${CMPLR_ROOT}/bin:${PATH} \
    CPATH=${CMPLR_ROOT}/include:${MKLROOT}/include:${TBBROOT}/include \
    LIBRARY_PATH=${CMPLR_ROOT}/lib:${MKLROOT}/lib:${TBBROOT}/lib/intel64/gcc4.8:${UMF_ROOT}/lib \
    LD_LIBRARY_PATH=${CMPLR_ROOT}/lib:${MKLROOT}/lib:${TBBROOT}/lib/intel64/gcc4.8:${UMF_ROOT}/lib:${ONEAPI_ROOT}/pti/latest/lib \
    OCL_ICD_FILENAMES=libintelocl.so

COPY wheelhouse/ /wheelhouse/
COPY builder-requirements.txt /usr/local/share/activekv/builder-requirements.txt
RUN set -eux; \
    for v in ${PYTHON_VERSIONS}; do \
      tag="cp$(echo "$v" | tr -d .)"; py="/opt/python/$tag-$tag/bin/python"; \
      test -x "$py" || { echo "this manylinux image has no CPython $v ($py)" >&2; exit 1; }; \
      "$py" -m pip install --no-deps --index-url "${TORCH_INDEX_URL}" --find-links /wheelhouse "torch==${TORCH}"; \
      "$py" -m pip install --index-url "${INDEX_URL}" --find-links /wheelhouse \
        -r /usr/local/share/activekv/builder-requirements.txt; \
    done; \
    rm -rf /wheelhouse /root/.cache/pip
