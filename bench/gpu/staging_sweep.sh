#!/bin/bash
# Staged copies (program memory <-> GPU through pinned buffers) by chunk size
# and thread count: the ratio to pinned cuMemcpyAsync for 256 MiB and 1 GiB.
# Run on the GPU machine from the repository root.
B=build-dev/unimem
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null &&
  cmake --build build-dev -j 16 > /dev/null 2>&1 || { echo build failed; exit 1; }
for c in ${CHUNKS:-1M 2M 4M 8M}; do for t in ${THREADS:-8 12}; do
  echo "chunk=$c threads=$t: $(UNIMEM_CONF=copy_chunk=$c,copy_threads=$t $B bench copy --json | python3 -c "
import json,sys
r=[json.loads(l) for l in sys.stdin if l.startswith('{\"direction')]
print(' '.join('%s%d:%.3f'%(x['direction'],x['bytes']>>20,x['ratio']) for x in r if x['memory']=='pageable' and x['bytes']>=256<<20))")"
done; done
