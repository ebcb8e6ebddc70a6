// Package logshape holds the test that keeps the plugin's log lines in
// one shape: the message is a short, stable key an operator can grep and
// a script can match; what happened, why and what to do go in attributes
// ("why", "hint", "err", ...). It has no code of its own.
package logshape
