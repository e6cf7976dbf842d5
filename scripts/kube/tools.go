//go:build tools

// The control plane the Kubernetes connector is tested on: this module only pins the versions
// that scripts/kube.sh builds (kube-apiserver and kube-scheduler from k8s.io/kubernetes, kwok,
// and etcd from ./etcd).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
