//go:build tools

// SeaweedFS's `weed` program (its S3 gateway among its servers).
package tools

import _ "github.com/seaweedfs/seaweedfs/weed"
