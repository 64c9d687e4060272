// Package limits reads the two files an operator writes to control spend: the prices file
// (what each provider's model costs, so a run's cost_usd can be computed) and the limits file
// (per-caller rate limits, day budgets, in-flight caps and the use of the exact cache).
//
// Both are YAML, parsed through yaml.v3's node tree so every problem names its line; a file
// with problems is refused as a whole with one error listing all of them (*FileError), never
// half applied. LoadPrices and LoadLimits wrap the parsers in livefile, so an edit takes effect
// without a restart and a bad edit keeps the last good version.
//
// The package only parses and matches; worker/budget enforces the limits and worker/cache
// serves the cache.
package limits
