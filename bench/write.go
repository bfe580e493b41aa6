package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// A writeCase is one shape of business transaction: how many messages it sends and
// how many writers run it at once.
type writeCase struct {
	Name    string
	Msgs    int
	Writers int
	Target  float64 // at most this multiple of the business transaction alone
	// LogTarget is the log mode's target, likewise.
	LogTarget float64
}

var writeCases = []writeCase{
	{Name: "+1 message, 1 writer", Msgs: 1, Writers: 1, Target: 1.15, LogTarget: 1.05},
	{Name: "+10 messages, 1 writer", Msgs: 10, Writers: 1, Target: 1.8, LogTarget: 1.3},
	{Name: "+1 message, 8 writers", Msgs: 1, Writers: 8, Target: 1.4, LogTarget: 1.1},
}

// writeResult is one database's write-cost table: per case and contender, the mean
// µs per transaction of every repetition and its multiple of the business
// transaction in the same repetition.
type writeResult struct {
	DB          string
	Contenders  []string
	Cases       []writeCase
	TxPerWriter map[int]int          // transactions per writer, by writer count
	Micros      map[string][]float64 // case/contender → per repetition
	Ratio       map[string][]float64
	Checks      map[string]*checks // by contender
}

func wkey(c writeCase, contender string) string { return c.Name + "/" + contender }

func writeScenario(ctx context.Context, e *env, db string, contenders []contender, sz sizes, reps int) (*writeResult, error) {
	res := &writeResult{DB: db, Cases: writeCases, TxPerWriter: map[int]int{1: sz.writeTx, 8: sz.writeTxEach},
		Micros: map[string][]float64{}, Ratio: map[string][]float64{}, Checks: map[string]*checks{}}
	for _, c := range contenders {
		res.Contenders = append(res.Contenders, c.name)
		if c.name != business.name {
			res.Checks[c.name] = &checks{}
		}
	}
	for _, wc := range writeCases {
		txs := res.TxPerWriter[wc.Writers]
		for rep := range reps {
			us, chs, err := writeRep(ctx, e, contenders, wc, txs)
			if err != nil {
				return nil, fmt.Errorf("write %s, %s, rep %d: %w", db, wc.Name, rep+1, err)
			}
			base := us[0] // contenders[0] is the business transaction alone
			for i, c := range contenders {
				k := wkey(wc, c.name)
				res.Micros[k] = append(res.Micros[k], us[i])
				res.Ratio[k] = append(res.Ratio[k], us[i]/base)
				if i > 0 {
					res.Checks[c.name].add(chs[i])
				}
				say("write %s | %-24s | rep %d | %-18s | %8.1f µs/tx  %.2f×", db, wc.Name, rep+1, c.name, us[i], us[i]/base)
			}
		}
	}
	return res, nil
}

// writeRep runs txs business transactions per writer for every contender, after a
// few untimed ones to warm the connections, and returns each contender's mean µs
// per transaction. The contenders take turns transaction by transaction (each
// writer runs one of each in turn), so a slow moment of the machine falls on all
// of them alike. Then each contender's relay publishes what was written and the
// delivery is checked.
func writeRep(ctx context.Context, e *env, contenders []contender, wc writeCase, txs int) ([]float64, []check, error) {
	sessions := make([]*session, len(contenders))
	plans := make([]*plan, len(contenders))
	defer func() {
		for _, s := range sessions {
			if s != nil {
				_ = s.close(ctx)
			}
		}
	}()
	warm := max(10, txs/20)
	// Every message is built before the clock starts.
	work := make([][][][]message, len(contenders)) // contender, writer, transaction
	for i, c := range contenders {
		s, err := open(ctx, e, c)
		if err != nil {
			return nil, nil, err
		}
		sessions[i], plans[i] = s, newPlan(wc.Writers)
		work[i] = make([][][]message, wc.Writers)
		for w := range work[i] {
			work[i][w] = make([][]message, warm+txs)
			if c.name != business.name {
				for t := range work[i][w] {
					work[i][w][t] = plans[i].next(w, wc.Msgs)
				}
			}
		}
	}
	var order atomic.Int64
	tx := func(i, w, t int) error {
		_, err := sessions[i].in.write(ctx, order.Add(1), work[i][w][t])
		return err
	}
	for w := range wc.Writers {
		for t := range warm {
			for i := range contenders {
				if err := tx(i, w, t); err != nil {
					return nil, nil, fmt.Errorf("%s: %w", contenders[i].name, err)
				}
			}
		}
	}
	totals := make([]atomic.Int64, len(contenders))
	var wg sync.WaitGroup
	errs := make([]error, wc.Writers)
	for w := range wc.Writers {
		wg.Go(func() {
			for t := warm; t < warm+txs; t++ {
				for i := range contenders {
					start := time.Now()
					if err := tx(i, w, t); err != nil {
						errs[w] = fmt.Errorf("%s: %w", contenders[i].name, err)
						return
					}
					totals[i].Add(int64(time.Since(start)))
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	us := make([]float64, len(contenders))
	chs := make([]check, len(contenders))
	for i, c := range contenders {
		us[i] = float64(totals[i].Load()) / float64(wc.Writers*txs) / 1e3
		if c.name == business.name {
			continue
		}
		ch, err := sessions[i].deliver(ctx, plans[i], 500)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", c.name, err)
		}
		chs[i] = ch
	}
	return us, chs, nil
}
