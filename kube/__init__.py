"""The Kubernetes connector (``fairstream kubernetes``): pods in, bindings and evictions out.

``translate`` (pods and nodes to wire events, pure), ``mirror`` (the cluster as the connector
knows it, and what each change or decision asks: pure), ``api`` (the calls to the API server,
through lightkube), ``connector`` (the loop that joins them to the worker's topics),
``controlplane`` (the real etcd, kube-apiserver and kwok of ``scripts/kube.sh``, for the tests
and ``fairstream bench kubernetes``). docs/kubernetes.md says how it works and why.
"""
