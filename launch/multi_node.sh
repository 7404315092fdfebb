#!/usr/bin/env bash
# GPT pretraining (launch/pretrain_gpt.sh) on several machines: run this on every node, with the same
# MASTER_ADDR, MASTER_PORT and NNODES and the node's own NODE_RANK (the variables Megatron and
# Rapidformer scripts export; rapidgpt also reads them itself). Node 0 runs msrun's scheduler and
# shows rank 0's output; every node keeps the logs of its own ranks.
#
#   MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NNODES=2 NODE_RANK=0 launch/multi_node.sh   # on 10.0.0.1
#   MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NNODES=2 NODE_RANK=1 launch/multi_node.sh   # on the other
#
# Environment:
#   MASTER_ADDR, MASTER_PORT   node 0's address, and a free port there (required)
#   NNODES, NODE_RANK          the number of nodes, and this node's index 0 .. NNODES-1 (required)
#   NPROC_PER_NODE, TP, LOG_DIR, data variables   as for launch/single_node.sh; tensor parallelism
#                              stays inside a node (TP <= NPROC_PER_NODE), data parallelism spans nodes
# A rank that fails stops the ranks of its node at once and is reported there; the other nodes'
# ranks fail ~30 s later (MindSpore's heartbeat time-out) and are reported on their nodes.
set -euo pipefail

: "${MASTER_ADDR:?set MASTER_ADDR to node 0's address}"
: "${MASTER_PORT:?set MASTER_PORT to a free port on node 0 (the same on every node)}"
: "${NNODES:?set NNODES to the number of nodes}"
: "${NODE_RANK:?set NODE_RANK to this node's index, 0 .. NNODES-1}"
DISTRIBUTED_ARGS=(--nnodes "$NNODES" --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT")

exec "$(dirname "${BASH_SOURCE[0]}")/single_node.sh" "${DISTRIBUTED_ARGS[@]}" "$@"
