package batch

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"github.com/sys1hq/sys1/contract"
)

// MaxLineBytes is the longest input line (or CSV record) read: the contract's largest request
// body (contract.MaxBodyBytes, images included) plus room for a {"custom_id", "body"} wrapper.
// A longer line cannot hold a valid request, so it is refused with its line number without
// being held in memory: it is read through to its end, only counted.
const MaxLineBytes = contract.MaxBodyBytes + 64<<10

// sniffBytes is how much of the (decompressed) input is checked for NUL bytes, the mark of a
// binary file, before anything is parsed.
const sniffBytes = 8 << 10

// ErrEmpty means the input holds no line to run.
var ErrEmpty = errors.New("the input is empty: no line to run")

// file is an input file opened for one pass: decompressed when it is gzip (detected by its
// magic bytes, not its name) and hashed as stored, so the batch id names the bytes on disk.
type file struct {
	f    *os.File
	sum  hash.Hash
	raw  io.Reader // the file through the hash
	gz   *gzip.Reader
	text *bufio.Reader // the decompressed text
	path string
}

func openFile(path string) (*file, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open input: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("open input: %w", err)
	}
	if st.IsDir() {
		_ = f.Close()
		return nil, fmt.Errorf("open input: %s is a directory", path)
	}
	in := &file{f: f, sum: sha256.New(), path: path}
	in.raw = io.TeeReader(f, in.sum)
	head := bufio.NewReaderSize(in.raw, 64<<10)
	var text io.Reader = head
	if magic, _ := head.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		in.gz, err = gzip.NewReader(head)
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("%s starts like gzip but is not: %w", path, err)
		}
		text = in.gz
	}
	in.text = bufio.NewReaderSize(text, 64<<10)
	sniff, err := in.text.Peek(sniffBytes)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		_ = f.Close()
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if i := bytes.IndexByte(sniff, 0); i >= 0 {
		_ = f.Close()
		return nil, fmt.Errorf("%s is not text: a NUL byte at offset %d (expected JSONL or CSV, optionally gzip-compressed)", path, i)
	}
	// A byte-order mark (editors, spreadsheets) is not part of the first line.
	if bom, _ := in.text.Peek(3); bytes.Equal(bom, []byte{0xEF, 0xBB, 0xBF}) {
		_, _ = in.text.Discard(3)
	}
	return in, nil
}

// finish reads what is left of the raw file into the hash (bytes after a gzip stream's end)
// and returns the SHA-256 of the whole file.
func (in *file) finish() ([32]byte, error) {
	var sum [32]byte
	if _, err := io.Copy(io.Discard, in.raw); err != nil {
		return sum, fmt.Errorf("read %s: %w", in.path, err)
	}
	copy(sum[:], in.sum.Sum(nil))
	return sum, nil
}

func (in *file) close() error {
	if in.gz != nil {
		_ = in.gz.Close()
	}
	return in.f.Close()
}

// lineReader reads lines of at most max bytes. A longer line is reported (LineTooLong) and
// skipped: its bytes are read and counted, never kept.
type lineReader struct {
	br   *bufio.Reader
	max  int
	line int // number of the line last returned, 1-based
	buf  []byte
}

// LineTooLongError is a line over the bound.
type LineTooLongError struct {
	Line  int
	Bytes int64 // how long the line was
	Max   int
}

func (e *LineTooLongError) Error() string {
	return fmt.Sprintf("line %d is %d bytes, over the %d bytes a line may have (the contract's largest request is %d bytes); it was not read into memory",
		e.Line, e.Bytes, e.Max, contract.MaxImageRequestBytes)
}

func newLineReader(r *bufio.Reader, max int) *lineReader { return &lineReader{br: r, max: max} }

// next returns the next line without its line ending (\n or \r\n). The slice is valid until the
// next call. At the end it returns io.EOF; a line over the bound is a *LineTooLongError and the
// reader continues after it.
func (lr *lineReader) next() ([]byte, error) {
	if cap(lr.buf) > 1<<20 {
		lr.buf = nil // a long line's buffer is not kept for the short ones after it
	}
	lr.buf = lr.buf[:0]
	var total int64
	over := false
	var prevLast byte // the last byte of the previous chunk, for a \r\n split across two
	for {
		chunk, err := lr.br.ReadSlice('\n')
		total += int64(len(chunk))
		if !over {
			if len(lr.buf)+len(chunk) > lr.max+2 { // +2: the line ending is not content
				over = true
				lr.buf = lr.buf[:0]
			} else {
				lr.buf = lr.grow(len(chunk))
				lr.buf = append(lr.buf, chunk...)
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, bufio.ErrBufferFull):
			if len(chunk) > 0 {
				prevLast = chunk[len(chunk)-1]
			}
			continue
		case errors.Is(err, io.EOF):
			if total == 0 {
				return nil, io.EOF
			}
		default:
			return nil, fmt.Errorf("read line %d: %w", lr.line+1, err)
		}
		lr.line++
		if over {
			return nil, &LineTooLongError{Line: lr.line, Bytes: total - newlineLen(chunk, prevLast), Max: lr.max}
		}
		line := bytes.TrimSuffix(lr.buf, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) > lr.max {
			return nil, &LineTooLongError{Line: lr.line, Bytes: int64(len(line)), Max: lr.max}
		}
		return line, nil
	}
}

// grow makes room for n more bytes, doubling up to the bound but never past it, so a line
// near the bound costs about twice its size in allocations, not the geometric series' more.
func (lr *lineReader) grow(n int) []byte {
	need := len(lr.buf) + n
	if need <= cap(lr.buf) {
		return lr.buf
	}
	c := min(max(2*cap(lr.buf), need, 4096), lr.max+2)
	nb := make([]byte, len(lr.buf), max(c, need))
	copy(nb, lr.buf)
	return nb
}

// newlineLen is the length of the line ending that closes a line whose last chunk is
// lastChunk (prevLast: the byte before that chunk).
func newlineLen(lastChunk []byte, prevLast byte) int64 {
	switch {
	case bytes.HasSuffix(lastChunk, []byte("\r\n")), bytes.Equal(lastChunk, []byte("\n")) && prevLast == '\r':
		return 2
	case bytes.HasSuffix(lastChunk, []byte("\n")), bytes.HasSuffix(lastChunk, []byte("\r")): // a last line ending in \r
		return 1
	case len(lastChunk) == 0 && prevLast == '\r':
		// The input ended right after a chunk that filled the buffer with a final \r: the
		// last read brought nothing but the end.
		return 1
	}
	return 0
}
