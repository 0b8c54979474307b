# The runtime base with the target's vLLM's dependencies at the release's
# pins (pipeline/images.py runtime_dependencies_image): the runtime image adds
# only what is ours on top. Tagged by its inputs, so a new commit's runtime
# image reuses it (GBs installed once per set of pins, not per commit).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

COPY requirements.txt constraints.txt /tmp/activekv-dependencies/
# A constraints file that pins every distribution by its hash (the cuda
# target's, pipeline/runtime_pins.py) is installed as it is, each file
# checked, nothing resolved; one of versions only (the cpu target's)
# constrains pip's resolution of vLLM's requirements. vLLM's dependencies
# that cannot load beside the target's torch go again (release.toml
# [targets.*] broken_beside_torch keeps the list).
ARG BROKEN_BESIDE_TORCH
RUN set -eux; \
    if grep -q -e "--hash=sha256:" /tmp/activekv-dependencies/constraints.txt; then \
      pip install --require-hashes --no-deps -r /tmp/activekv-dependencies/constraints.txt; \
    else \
      pip install -r /tmp/activekv-dependencies/requirements.txt -c /tmp/activekv-dependencies/constraints.txt; \
    fi; \
    if [ -n "${BROKEN_BESIDE_TORCH}" ]; then pip uninstall --yes ${BROKEN_BESIDE_TORCH}; fi; \
    rm -rf /tmp/activekv-dependencies /root/.cache/pip
