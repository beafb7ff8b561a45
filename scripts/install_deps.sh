#!/usr/bin/env bash
# Installs what threewalls needs on Debian 12 (bookworm), from Debian's archive only.
# The CUDA toolkit (nvcc, cuBLAS, NCCL, NVTX3) is optional and expected in /usr/local/cuda; without it
# the build leaves out the GPU parts (backend, `threewalls run`, `threewalls calibrate`).
set -euo pipefail
packages=(
  cmake g++ make pkg-config git clang-format clang-tidy
  libsimgrid-dev libeigen3-dev libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libgtest-dev
  jupyter-nbconvert python3-nbformat python3-ipykernel python3-pandas python3-matplotlib
  python3-torch python3-numpy python3-pip python3-setuptools
  chromium
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
