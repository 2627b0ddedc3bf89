"""`mokka agent`, the node's Kubernetes side, by layer: the annotation grammar (`grammar`), the
pure reconcile decisions (`decisions`), the CDI spec and NFD feature file as text (`node_files`),
and the edge that watches the API and acts on the mount (`watch`)."""
