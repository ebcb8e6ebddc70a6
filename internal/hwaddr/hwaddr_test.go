package hwaddr

import (
	"encoding/json"
	"testing"
)

func TestParseAndString(t *testing.T) {
	m, err := Parse("02:42:AC:11:00:02")
	if err != nil {
		t.Fatal(err)
	}
	if m.String() != "02:42:ac:11:00:02" {
		t.Fatalf("String() = %s", m)
	}
	for _, bad := range []string{"", "zz:zz:zz:zz:zz:zz", "00:00:00:00:00:00:00:01", "02:42:ac:11:00"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestJSONRoundTrip(t *testing.T) {
	in := MAC{2, 0, 0, 0, 0, 1}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `"02:00:00:00:00:01"` {
		t.Fatalf("json %s", b)
	}
	var out MAC
	if err := json.Unmarshal(b, &out); err != nil || out != in {
		t.Fatalf("round trip: %v %v", out, err)
	}
	if err := json.Unmarshal([]byte(`"nope"`), &out); err == nil {
		t.Fatal("bad MAC decoded")
	}
	if hw := in.HardwareAddr(); len(hw) != 6 || hw[5] != 1 {
		t.Fatalf("HardwareAddr %v", hw)
	}
	if m, ok := FromHardwareAddr(in.HardwareAddr()); !ok || m != in {
		t.Fatal("FromHardwareAddr")
	}
}
