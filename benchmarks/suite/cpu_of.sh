#!/bin/bash
# cpu_of.sh CMD...: runs CMD (its output to $CPU_OF_OUT, default /tmp/cpu_of.out), prints its wall time and the whole
# machine's CPU seconds over it (user + nice + system, from /proc/stat before and after): on this 2-core machine the CPU a
# build or a test run costs is what it takes from everything else (benchmarks/results/tests/*.txt use it).
read -r _ u n s i rest < /proc/stat; t0=$(date +%s.%N)
"$@" > "${CPU_OF_OUT:-/tmp/cpu_of.out}" 2>&1; rc=$?
read -r _ u2 n2 s2 i2 rest < /proc/stat; t1=$(date +%s.%N)
echo "rc=$rc wall=$(echo "$t1 - $t0" | bc) s cpu=$(( (u2+n2+s2-u-n-s) / 100 )) s (user $(( (u2+n2-u-n)/100 )) sys $(( (s2-s)/100 )))"
