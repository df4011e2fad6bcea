#!/bin/bash
# bench copy three times in a row (the machine's noise), default options.
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null &&
  cmake --build build-dev -j 16 > /dev/null 2>&1 || { echo build failed; exit 1; }
mkdir -p "${OUT:-out}"
for i in 1 2 3; do
  build-dev/unimem bench copy > "${OUT:-out}/bench_copy_$i.txt" 2>&1
  grep -E "256|GiB|acquire" "${OUT:-out}/bench_copy_$i.txt"
done
