package inpod

import "time"

// SetRetryInterval shortens the pending-pod retry for tests.
func SetRetryInterval(c *Client, d time.Duration) { c.retryInterval = d }
