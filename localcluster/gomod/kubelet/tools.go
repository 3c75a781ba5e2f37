//go:build tools

// Package tools pins the node binary this module builds: the kubelet. It is a wrapper of its own,
// not a line in ../kubernetes/tools.go: the kubelet pulls in modules (cadvisor, cri-streaming, ...)
// that the control plane does not, and changing ../kubernetes/go.sum would rebuild the control plane.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
