//go:build tools

// fake-gcs-server: Google Cloud Storage's JSON API in one process, for the gs:// store.
package tools

import _ "github.com/fsouza/fake-gcs-server"
