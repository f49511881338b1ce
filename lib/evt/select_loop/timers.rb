# frozen_string_literal: true

module Evt
  class SelectLoop
    # The pure-Ruby loop's timer heap (see lib/evt/select_loop.rb).

    # The timer heap, as ext/evt/timers.c has it: a binary min-heap on [deadline, sequence] whose
    # timers know their index in it, so a timer leaves at once, by its index, with no search and
    # nothing left behind to skip later. Equal deadlines fire in the order they were added.
    # @api private
    class Timers
      # One timer: its deadline (monotonic nanoseconds), the order it was added in, what it fires
      # (a {Waiter} or a {Timeout}), and `index`: its position in the heap, nil when it is not in
      # it.
      Timer = Struct.new(:deadline, :sequence, :target, :index)

      # An empty heap.
      def initialize
        @heap = []
        @sequence = 0 # not reset by #clear, as in C: only its order matters
      end

      # Adds a timer firing `target` at `deadline`.
      # @param deadline [Integer] monotonic nanoseconds
      # @return [Timer] the timer, for {#remove}
      def add(deadline, target)
        timer = Timer.new(deadline, @sequence, target, nil)
        @sequence += 1
        place(@heap.size, timer)
        sift_up(timer.index)
        timer
      end

      # Takes `timer` out of the heap; nothing when it is not in it (it fired, or left already). The
      # last timer takes its place and moves up or down from there.
      # @return [void]
      def remove(timer)
        index = timer.index or return
        timer.index = nil
        last = @heap.pop
        return if index == @heap.size

        place(index, last)
        if index.positive? && earlier?(last, @heap[(index - 1) / 2]) then sift_up(index)
        else sift_down(index)
        end
      end

      # @return [Timer, nil] the earliest timer
      def first
        @heap.first
      end

      # Yields each timer, in no particular order.
      # @yieldparam timer [Timer]
      def each(&block)
        @heap.each(&block)
      end

      # @return [Integer] the number of timers
      def size
        @heap.size
      end

      # Takes every timer out.
      # @return [void]
      def clear
        @heap.each { |timer| timer.index = nil }
        @heap.clear
      end

      private

      def earlier?(a, b)
        a.deadline < b.deadline || (a.deadline == b.deadline && a.sequence < b.sequence)
      end

      def place(index, timer)
        @heap[index] = timer
        timer.index = index
      end

      # Moves the timer at `index` up until its parent is earlier, shifting the parents down.
      def sift_up(index)
        timer = @heap[index]
        while index.positive?
          parent = (index - 1) / 2
          break unless earlier?(timer, @heap[parent])

          place(index, @heap[parent])
          index = parent
        end
        place(index, timer)
      end

      # Moves the timer at `index` down until no child is earlier, shifting the earlier child up.
      def sift_down(index)
        timer = @heap[index]
        size = @heap.size
        while (child = (2 * index) + 1) < size
          child += 1 if child + 1 < size && earlier?(@heap[child + 1], @heap[child])
          break unless earlier?(@heap[child], timer)

          place(index, @heap[child])
          index = child
        end
        place(index, timer)
      end
    end
  end
end
