package batch

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/sys1hq/sys1/contract"
)

// Output statuses of an item.
const (
	StatusSuccess   = "success"
	StatusFailed    = "failed"
	StatusInvalid   = "invalid"   // refused locally: never sent
	StatusCancelled = "cancelled" // sys1 batch cancel stopped it before it ran
)

// PartialSuffix marks output files being written. A run writes OUT.partial and
// OUT.errors.jsonl.partial from scratch and renames them to their names only once every line is
// in: a file without the suffix is always complete, and a killed run leaves only .partial files
// behind (the next run truncates them and starts over, answered from the run-id gate).
const PartialSuffix = ".partial"

// ErrorsPath is the errors file of an output file: OUT.errors.jsonl.
func ErrorsPath(out string) string { return out + ".errors.jsonl" }

// Output writes the results file and the errors file, both in input order.
type Output struct {
	Path, ErrorsPath string
	res, errs        *os.File
	rw, ew           *bufio.Writer
	Lines, Errors    int
}

// CreateOutput starts both files as .partial, new: what a killed run left there is removed
// first, and the files are created with O_EXCL, which follows no symbolic link — a link planted
// at OUT.partial (pointing at a file the batch's user may write) is removed, never written
// through. Rename then gives them their names, replacing (not following) whatever is there.
func CreateOutput(path string) (*Output, error) {
	o := &Output{Path: path, ErrorsPath: ErrorsPath(path)}
	var err error
	if o.res, err = createNew(o.Path + PartialSuffix); err != nil {
		return nil, fmt.Errorf("create output: %w", err)
	}
	if o.errs, err = createNew(o.ErrorsPath + PartialSuffix); err != nil {
		_ = o.res.Close()
		return nil, fmt.Errorf("create errors output: %w", err)
	}
	o.rw, o.ew = bufio.NewWriterSize(o.res, 256<<10), bufio.NewWriterSize(o.errs, 64<<10)
	return o, nil
}

// createNew creates name afresh: anything at name that is not a directory is removed (a
// symbolic link itself, not its target), then the file is created exclusively, so that if
// something appears there in between the create fails rather than follow it.
func createNew(name string) (*os.File, error) {
	if st, err := os.Lstat(name); err == nil {
		if st.IsDir() {
			return nil, fmt.Errorf("%s is a directory", name)
		}
		if err := os.Remove(name); err != nil {
			return nil, fmt.Errorf("remove what an earlier run left: %w", err)
		}
	}
	return os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
}

// write appends one line (without its newline) to the results, and to the errors file unless
// the item succeeded.
func (o *Output) write(line []byte, status string) error {
	line = append(line, '\n')
	if _, err := o.rw.Write(line); err != nil {
		return fmt.Errorf("write %s: %w", o.Path+PartialSuffix, err)
	}
	o.Lines++
	if status != StatusSuccess {
		if _, err := o.ew.Write(line); err != nil {
			return fmt.Errorf("write %s: %w", o.ErrorsPath+PartialSuffix, err)
		}
		o.Errors++
	}
	return nil
}

// Commit makes both files durable and gives them their names: errors first, so a results file
// under its name always has its errors file beside it.
func (o *Output) Commit() error {
	for _, f := range []struct {
		w    *bufio.Writer
		f    *os.File
		name string
	}{{o.ew, o.errs, o.ErrorsPath}, {o.rw, o.res, o.Path}} {
		if err := f.w.Flush(); err != nil {
			return fmt.Errorf("write %s: %w", f.name+PartialSuffix, err)
		}
		if err := f.f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", f.name+PartialSuffix, err)
		}
		if err := f.f.Close(); err != nil {
			return fmt.Errorf("close %s: %w", f.name+PartialSuffix, err)
		}
		if err := os.Rename(f.name+PartialSuffix, f.name); err != nil {
			return fmt.Errorf("rename the finished output: %w", err)
		}
	}
	if d, err := os.Open(filepath.Dir(o.Path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// Abort flushes and closes the .partial files, leaving them for inspection; they never take
// the output's name.
func (o *Output) Abort() error {
	err1 := o.rw.Flush()
	err2 := o.ew.Flush()
	return errors.Join(err1, err2, o.res.Close(), o.errs.Close())
}

// outcome is one item's conclusion: its status and the reply parts the output line carries.
type outcome struct {
	status   string
	result   json.RawMessage // success
	errJSON  json.RawMessage // failed, invalid, cancelled
	code     string
	verdicts json.RawMessage
}

// line renders an item's output line. Everything in it comes from the input and from the
// reply's stored bytes (the run-id gate answers a finished run with the very same reply), and
// nothing from the clock, so a resumed batch writes exactly what an uninterrupted one would.
func (e *Entry) line(runID string, oc *outcome) []byte {
	b := make([]byte, 0, 128+len(oc.result)+len(oc.errJSON)+len(oc.verdicts))
	b = append(b, `{"custom_id":`...)
	b = contract.AppendJSONString(b, e.CustomID)
	b = append(b, `,"line":`...)
	b = strconv.AppendInt(b, int64(e.Line), 10)
	b = append(b, `,"run_id":`...)
	b = contract.AppendJSONString(b, runID)
	b = append(b, `,"status":`...)
	b = contract.AppendJSONString(b, oc.status)
	if oc.status == StatusSuccess {
		b = append(append(b, `,"result":`...), oc.result...)
	} else {
		b = append(append(b, `,"error":`...), oc.errJSON...)
	}
	if len(oc.verdicts) > 0 && string(oc.verdicts) != "null" {
		b = append(append(b, `,"verdicts":`...), oc.verdicts...)
	}
	return append(b, '}')
}

// localError is an outcome decided here, without a worker.
func localError(status string, cerr *contract.Error) *outcome {
	j, _ := cerr.MarshalJSON()
	return &outcome{status: status, errJSON: j, code: string(cerr.Code)}
}
