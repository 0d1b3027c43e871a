"""One module per outside system the controller acts through."""
