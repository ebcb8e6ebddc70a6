#!/usr/bin/env bash
# scripts/vm/e2e-docker-guest.sh: runs INSIDE the test VM (started by
# scripts/e2e-docker-vm.sh, which installed and built everything first):
# scripts/e2e-docker.sh with ESP expected and the plugin as built.
set -euo pipefail

# The guest's / is an overlayfs, which overlay2 cannot stack on: Docker's
# data roots (under E2E_TMP, made in TMPDIR) go on a tmpfs of their own.
# Not on /tmp itself: the checkout may live there (a CI clone does), and the
# tmpfs would hide it. A short name: exec-roots under it hold plugin
# sockets, whose paths are limited (see e2e_make_tmp).
mkdir -p /run/t
mount -t tmpfs -o mode=1777 tmpfs /run/t
export TMPDIR=/run/t

export E2E_EXPECT_ESP=1 E2E_SKIP_BUILD=1
# Docker's own overlay, the harness's self-test, passes in the Docker layer
# on the host; here it would cost two to three minutes.
export E2E_SELFTEST=0
# Emulation makes every process start cost ~0.1 s: dockerd takes ~30 s to
# start, a task several seconds, and twice that when the host is busy.
export E2E_TASK_TIMEOUT=${E2E_TASK_TIMEOUT:-300} E2E_TIME_SCALE=${E2E_TIME_SCALE:-4}
export PLUGIN_ENABLE_TIMEOUT=${PLUGIN_ENABLE_TIMEOUT:-180}
# check_disable_enable expects traffic to flow while a plugin is disabled,
# which holds for as long as the peers keep its endpoints and keys
# (--dead-grace, 30 s; README, Restarts); here the check keeps a plugin
# disabled for one minute, and for four and a half on a host loaded 8 times
# over (3 minutes were too short then). 10m is the gossip's tombstone TTL,
# which the grace must not exceed.
export E2E_PLUGIN_SETTINGS="OVERLAY_DEAD_GRACE=10m ${E2E_PLUGIN_SETTINGS:-}"
exec bash scripts/e2e-docker.sh
