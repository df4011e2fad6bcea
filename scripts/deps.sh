#!/bin/sh
# Checks for the build's tools and libraries; as root on a Debian machine it
# installs what is missing, otherwise it says what to install.
need=""
command -v cmake >/dev/null 2>&1 || need="$need cmake"
command -v cc >/dev/null 2>&1 || need="$need gcc"
command -v make >/dev/null 2>&1 || need="$need make"
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
[ -f /usr/include/zlib.h ] || need="$need zlib1g-dev"
# OpenBLAS (with its LAPACK) for `unimem demo`: its pkg-config module, or the
# library where a distribution installs it without one.
has_openblas() {
    pkg-config --exists openblas 2>/dev/null && return 0
    for d in /usr/lib /usr/lib64 /usr/local/lib /usr/lib/*-linux-gnu /usr/lib/*-linux-gnu/openblas*; do
        [ -e "$d/libopenblas.so" ] && return 0
    done
    return 1
}
has_openblas || need="$need libopenblas-dev"
# Optional: Chromium for the timeline page's browser test (which skips,
# saying so, without it). Installed when possible, never a failure.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "unimem: installing chromium (optional: the timeline page's browser test)"
        { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } \
            >/dev/null 2>&1 || echo "unimem: chromium could not be installed; the timeline test will skip"
    else
        echo "unimem: chromium is not installed; the timeline page's browser test will skip"
    fi
fi
[ -z "$need" ] && exit 0
echo "unimem: missing build dependencies:$need"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "unimem: installing them with apt-get"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $need && exit 0
    echo "unimem: apt-get failed; install these packages:$need" >&2
    exit 1
fi
echo "unimem: please install these Debian packages (as root: apt-get install$need)" >&2
exit 1
