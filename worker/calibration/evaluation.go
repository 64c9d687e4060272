package calibration

import (
	"time"

	"github.com/sys1hq/sys1/worker/calibration/risk"
)

// Evaluation is what a scheduled evaluation (sys1 calibrate --report --apply) measured for one
// stored fit over its label window, stored in the fit for the workers to export as metrics.
type Evaluation struct {
	// At is when it ran; Since and Until the window of labels (labelled_at) and runs
	// (finished_at) it read.
	At    time.Time `json:"at"`
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// Audits is the number of audit samples labelled in the window; DecidedError the error of
	// the decided answers estimated from them alone (weighted by their shares, so unbiased),
	// with its interval; nil without audits.
	Audits       int            `json:"audits"`
	DecidedError *risk.Interval `json:"decided_error,omitempty"`
	// Decided and Abstained count the window's answers by verdict (from the run records);
	// Coverage is the decided share, AbstentionRate the abstained one; nil when the run records
	// could not be read.
	Decided        int64    `json:"decided"`
	Abstained      int64    `json:"abstained"`
	Coverage       *float64 `json:"coverage,omitempty"`
	AbstentionRate *float64 `json:"abstention_rate,omitempty"`
	// RecentLabels is the number of labels newer than the fit's last label; RecentECE their
	// ECE with the fit applied (nil without any), to compare with FitECE, the ECE of the
	// labels it was fitted on.
	RecentLabels int      `json:"recent_labels"`
	RecentECE    *float64 `json:"recent_ece,omitempty"`
	FitECE       float64  `json:"fit_ece"`
}
