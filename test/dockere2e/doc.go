// Package dockere2e holds the end-to-end checks of the plugin under a real
// Docker swarm, as Go tests, one per check of scripts/e2e/checks.sh
// (check_plugin_service is TestCheckPluginService, so E2E_CHECKS selects
// them through -run). Bash brings the swarm up (scripts/e2e-docker.sh:
// dockerds in network namespaces on this machine; scripts/e2e-docker-vm.sh:
// the same in the test VM) and names it in the environment (env.go); the
// tests drive it through a small node wrapper (node.go: a node's docker CLI
// and a shell on its host, Calico Felix's fv/containers in spirit), judge
// connectivity as a matrix (connectivity.go) and the underlay with the
// testbed's wire classifier (wire.go). Without that environment, as in a
// plain `go test ./...`, every test skips with the reason.
package dockere2e
