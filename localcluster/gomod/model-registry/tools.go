//go:build tools

// Keeps the server's package in the build list: go mod tidy keeps a requirement only if a file imports it.
package tools

import _ "github.com/kubeflow/model-registry"
