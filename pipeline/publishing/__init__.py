"""Where a release is published: folders written whole (files), package
indexes (index: a folder or a real index behind one PackageIndex interface),
OCI registries (registry), and HTTP reads of them (http). The publish stage
(pipeline/stages/publish.py) decides what goes where and in which order."""
