# Sourced by the scripts: mpirun may run as root (containers, CI) and may
# start more ranks than cores (the tests start 4 ranks on 2 cores).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# NVLink multicast stays off on the shared GPU hosts.
export NCCL_NVLS_ENABLE=0
