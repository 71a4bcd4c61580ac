package devdb

// SetBinaryRepositoryURL points the embedded server's downloads at u until restore.
func SetBinaryRepositoryURL(u string) (restore func()) {
	old := binaryRepositoryURL
	binaryRepositoryURL = u
	return func() { binaryRepositoryURL = old }
}
