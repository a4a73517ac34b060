//go:build tools

// The Kubeflow training operator v1 (PyTorchJob and the other v1 jobs), built as released.
package tools

import _ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
