#!/bin/sh
# Eighth pass, a second sample: the GPU tests and the reap bench on the final tree.
set -u
R=$OUT; export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/iu-pycache
{ date; uname -a; nproc; python3 --version; uptime; nvidia-smi; } > $R/machine.txt 2>&1
python3 -c "import pynvml, infer_units.helpers.entry" 2>/dev/null
timeout 120 python3 -m pytest -q -s -rs -p no:cacheprovider tests/gpu > $R/gpu-tests.log 2>&1; echo "rc=$?" >> $R/gpu-tests.log
timeout 240 python3 bench/reap_bench.py --trials 10 --gib 20 --idle 2000 > $R/reap-bench.log 2>&1; echo "rc=$?" >> $R/reap-bench.log
date >> $R/machine.txt
tail -3 $R/gpu-tests.log; grep -E "median|goal|faster" $R/reap-bench.log | head -14
