// Package layering holds no code: its test checks the import rules between
// the plugin's packages, so that a lower layer never comes to depend on a
// higher one. The driver programs networks through narrow interfaces
// (kernel.Kernel, driver.Encryption, driver.ControlPlane) that the higher
// packages satisfy; the firewall and the kernel layer know nothing of
// IPsec keys or of the driver.
package layering
