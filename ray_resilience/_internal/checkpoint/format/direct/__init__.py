"""Direct I/O for checkpoint data files on POSIX file systems: writes and restores that bypass
the page cache (`files`), and tensor records read straight into their targets (`records`)."""
