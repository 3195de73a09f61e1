"""Where a job fits: host models and their topology, the cluster, what is free, and the
placement of a gang onto hosts, GPUs, cores, memory and NICs. Pure and synchronous."""
