package contract

import "encoding/json"

// Replies and records are read by other languages and loaded into ClickHouse, where a JSON
// null in place of an empty list is a needless special case: lists are always arrays.

// MarshalJSON encodes the SPEC §4 envelope with attempts always an array.
func (r Reply) MarshalJSON() ([]byte, error) {
	type plain Reply // no methods: avoids recursion
	if r.Attempts == nil {
		r.Attempts = []Attempt{}
	}
	return json.Marshal(plain(r))
}

// MarshalJSON encodes the SPEC §6 record with roles, scopes, images and attempts always
// arrays.
func (r RunRecord) MarshalJSON() ([]byte, error) {
	type plain RunRecord
	if r.Roles == nil {
		r.Roles = []string{}
	}
	if r.Scopes == nil {
		r.Scopes = []string{}
	}
	if r.Images == nil {
		r.Images = []ImageRef{}
	}
	if r.Attempts == nil {
		r.Attempts = []Attempt{}
	}
	return json.Marshal(plain(r))
}
