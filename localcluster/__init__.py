"""A real Kubernetes control plane, Kubeflow Trainer and JobSet on 127.0.0.1, built from Go modules.

See docs/cluster.md. versions.py pins every binary; gobuild.py builds them; controlplane.py runs
etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok; kubeflow.py adds the JobSet
and Trainer controller managers with their webhooks.
"""
