#!/bin/sh
# Installs the build into a temporary prefix, then builds a program against
# it twice: with CMake's find_package(unimem) and with pkg-config.
set -eu
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
test -f "$tmp/prefix/include/unimem.h"
cmake -S "$src/tests/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/cfg.log"
cmake --build "$tmp/consumer" > "$tmp/build.log"
"$tmp/consumer/consumer"
libdir=$(ls -d "$tmp"/prefix/lib*/pkgconfig | head -1)
PKG_CONFIG_PATH="$libdir" pkg-config --exists unimem
cc -o "$tmp/pc" "$src/tests/consumer/main.c" $(PKG_CONFIG_PATH="$libdir" pkg-config --cflags unimem) \
   "$(dirname "$libdir")/libunimem.a" -lz -lpthread -ldl
"$tmp/pc"
echo "install_check: 2 passed, 0 failed"
