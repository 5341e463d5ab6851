#!/bin/bash
# A/B of MPI waits (bench/RESULTS.md section 3): for each source tree given
# (built in place), alternated REPS times, 2 ranks: the cifar-vector allreduce
# and 4 epochs of `sprint train ${TRAIN:---parallel sync}` on digits (img/s of
# epoch 4, wall and CPU seconds). Run it under /work/coord/cpu-exclusive:
#   REPS=3 cpu-exclusive bench/mpi_wait_ab.sh OLD_TREE NEW_TREE
reps=${REPS:-3}
for i in $(seq $reps); do
  for t in "$@"; do
    name=$(basename $t)
    cd $t
    r=$(PYTHONPATH=$t OMP_NUM_THREADS=1 mpiexec -n 2 python -m mpi4py bench/parallel_allreduce.py --reps 30 2>&1 | tail -1)
    echo "$name allreduce $r"
    rm -rf ${TMPDIR:-/tmp}/mpi_wait_ab_run
    /usr/bin/time -f "%e wall %U user %S sys" -o ${TMPDIR:-/tmp}/mpi_wait_ab_time env PYTHONPATH=$t SPRINT_DEVICE=cpu mpiexec -n 2 python -m mpi4py -m engine.cli train ${TRAIN:---parallel sync} --epochs 4 --no-progress --out ${TMPDIR:-/tmp}/mpi_wait_ab_run > ${TMPDIR:-/tmp}/mpi_wait_ab_out 2>&1
    echo "$name sync: $(grep -E '^epoch   4' ${TMPDIR:-/tmp}/mpi_wait_ab_out | grep -oE '[0-9,]+ img/s') $(grep -oE 'done: .*s,' ${TMPDIR:-/tmp}/mpi_wait_ab_out) $(cat ${TMPDIR:-/tmp}/mpi_wait_ab_time)"
  done
done
