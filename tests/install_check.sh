#!/bin/sh
# Installs the build into a temporary prefix, then builds a program against
# it with CMake's find_package(unimem) (shared and static) and with
# pkg-config (shared and static).
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
"$tmp/consumer/consumer_static"
libdir=$(ls -d "$tmp"/prefix/lib*/pkgconfig | head -1)
PKG_CONFIG_PATH="$libdir" pkg-config --exists unimem
cc -o "$tmp/pc" "$src/tests/consumer/main.c" $(PKG_CONFIG_PATH="$libdir" pkg-config --cflags --libs unimem)
LD_LIBRARY_PATH="$(dirname "$libdir")" "$tmp/pc"
cc -o "$tmp/pc_static" "$src/tests/consumer/main.c" $(PKG_CONFIG_PATH="$libdir" pkg-config --cflags unimem) \
   "$(dirname "$libdir")/libunimem.a" $(PKG_CONFIG_PATH="$libdir" pkg-config --libs-only-l --static unimem | sed 's/-lunimem//')
"$tmp/pc_static"
echo "install_check: 4 passed, 0 failed"
