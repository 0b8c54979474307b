#!/bin/sh
# install-torch.sh PYTHON VERSION INDEX_URL TORCH_INDEX_URL
# The target's torch from the local wheelhouse (find-links) when it holds that
# version, else from the target's torch index; its dependencies from INDEX_URL.
# A torch index that this host cannot reach is then never asked.
set -eu
py=$1 version=$2 index=$3 torch_index=$4
if ls /wheelhouse/torch-"$version"-*.whl >/dev/null 2>&1; then
  exec "$py" -m pip install --index-url "$index" --find-links /wheelhouse "torch==$version"
fi
exec "$py" -m pip install --index-url "$index" --extra-index-url "$torch_index" \
  --find-links /wheelhouse "torch==$version"
