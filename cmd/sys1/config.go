package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/rs/zerolog"
)

// validator is implemented by component config structs that check more than types.
// Validate returns one error per bad variable, each naming the variable.
type validator interface {
	Validate() []error
}

// loadConfig parses every component's env struct and validates them, returning one error that
// names every bad variable, so an operator fixes a deployment in one pass.
func loadConfig(targets ...any) error {
	var problems []string
	for _, t := range targets {
		if err := env.Parse(t); err != nil {
			var agg env.AggregateError
			if errors.As(err, &agg) {
				for _, e := range agg.Errors {
					problems = append(problems, e.Error())
				}
			} else {
				problems = append(problems, err.Error())
			}
			continue
		}
		if v, ok := t.(validator); ok {
			for _, e := range v.Validate() {
				problems = append(problems, e.Error())
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid configuration:\n  - %s", strings.Join(problems, "\n  - "))
	}
	return nil
}

// LogConfig is the logging configuration shared by every long-running subcommand.
type LogConfig struct {
	Level string `env:"SYS1_LOG_LEVEL" envDefault:"info"`
}

// Validate checks the level name.
func (c *LogConfig) Validate() []error {
	if _, err := zerolog.ParseLevel(strings.ToLower(c.Level)); err != nil || c.Level == "" {
		return []error{fmt.Errorf("SYS1_LOG_LEVEL: %q is not one of trace, debug, info, warn, error", c.Level)}
	}
	return nil
}

// newLogger returns the JSON logger on w (stderr in production) at the configured level.
func newLogger(w io.Writer, cfg LogConfig, component string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(strings.ToLower(cfg.Level))
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return zerolog.New(w).Level(lvl).With().Timestamp().Str("component", component).Logger()
}

var _ = os.Stderr
