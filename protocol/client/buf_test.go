package client

import "testing"

// TestBufReleaseTwice: a second Release of a Buf does nothing. Were it to
// put the Buf into the pool of Bufs again, two later reads could be
// handed one Buf, each overwriting the other's data. (sync.Pool may drop
// what is Put, under -race at random, so the check is repeated.)
func TestBufReleaseTwice(t *testing.T) {
	data := []byte("data")
	for i := 0; i < 50; i++ {
		b := newBuf(data, nil, nil)
		b.Release()
		b.Release()
		x, y := newBuf(data, nil, nil), newBuf(data, nil, nil)
		if x == y {
			t.Fatalf("after a Buf was released twice two reads were given one Buf (round %d)", i)
		}
		x.Release()
		y.Release()
	}
}
